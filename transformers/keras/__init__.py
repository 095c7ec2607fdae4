"""The Keras network's training, split by concern.

- :mod:`.strategies`: how the ranks of one fit agree (the interface, and the choice by name);
- :mod:`.horovod_ring`: Horovod's ring all-reduce of the gradients every update (the default);
- :mod:`.tf_collective`: TensorFlow's ``MultiWorkerMirroredStrategy`` collective all-reduce,
  with no Horovod import at all;
- :mod:`.local_sgd`: each rank takes K optimizer steps alone, then the ranks average weights.

Adding a strategy is one module here with a :class:`~.strategies.RankStrategy` subclass, its
declaration in :data:`sparkdeep.registry.STRATEGY_RULES` (backend, the settings it takes:
config, the estimator and the ranks' contract all check against it) and one line in
:data:`~.strategies.IMPLEMENTATIONS`.
"""
