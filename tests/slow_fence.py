"""A fence wait held open for a while, so that a test can act while a call is in flight."""
import threading
import time

from vkdelegate.runtime.vkcall import FenceSubmit


def slow_fence_wait(monkeypatch, seconds: float = 0.3) -> threading.Event:
    """Patch DelegateGraph's fence wait (FenceSubmit.wait) to sleep ``seconds`` first;
    the returned event is set when a call has entered its wait. ``monkeypatch.undo()``
    restores it."""
    in_wait, real_wait = threading.Event(), FenceSubmit.wait

    def slow_wait(self, *args):
        in_wait.set()
        time.sleep(seconds)
        return real_wait(self, *args)

    monkeypatch.setattr(FenceSubmit, "wait", slow_wait)
    return in_wait
