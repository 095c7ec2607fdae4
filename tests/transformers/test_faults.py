"""The rank's fault injection: off by default, exact about where it fires, strict about its setting."""
import pytest

from sparkdeep.transformers._faults import FAIL_AT_EPOCH_ENV, after_epoch_hook


def test_no_setting_no_hook(monkeypatch):
    monkeypatch.delenv(FAIL_AT_EPOCH_ENV, raising=False)
    assert after_epoch_hook() is None


def test_the_hook_raises_only_for_its_rank_and_epoch(monkeypatch):
    monkeypatch.setenv(FAIL_AT_EPOCH_ENV, "1:2")
    hook = after_epoch_hook()
    hook(0, 2)
    hook(1, 1)
    with pytest.raises(RuntimeError, match="injected failure after epoch 2"):
        hook(1, 2)


@pytest.mark.parametrize("bad", ["1", "a:2", "1:2:explode", "1:2:exit:now"])
def test_a_malformed_setting_is_refused_naming_it(monkeypatch, bad):
    monkeypatch.setenv(FAIL_AT_EPOCH_ENV, bad)
    with pytest.raises(ValueError, match=FAIL_AT_EPOCH_ENV):
        after_epoch_hook()
