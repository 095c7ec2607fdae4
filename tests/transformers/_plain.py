"""The estimator settings these tests were written for: no validation rows, no early
stopping, a constant learning rate. The estimator's own defaults are conf/base's
(``validationFraction`` 0.1, ``earlyStoppingPatience`` 2, ``lrSchedule`` cosine); a test
that counts epochs, rows per rank or history entries pins these instead."""
PLAIN = {"validationFraction": 0.0, "earlyStoppingPatience": 0, "lrSchedule": "constant"}
