"""liboffload in a Lightning Trainer:

    from liboffload.integrations.lightning import OffloadCallback
    trainer = lightning.pytorch.Trainer(..., callbacks=[OffloadCallback()])

marks the module's frozen parameters (requires_grad False) read-only when training starts and
each optimizer step's end. Without the preloaded shim both are no-ops. Works with the
`lightning` package and with the older `pytorch_lightning`.
"""

try:
    from lightning.pytorch import Callback
except ImportError as e_lightning:
    try:
        from pytorch_lightning import Callback
    except ImportError as e:
        raise ImportError(
            "liboffload.integrations.lightning needs the lightning package (pip install "
            f"lightning) or pytorch_lightning: {e_lightning}; {e}", name="lightning") from e

import liboffload

__all__ = ["OffloadCallback"]


class OffloadCallback(Callback):
    """Calls liboffload.mark_frozen(pl_module) at on_train_start and liboffload.mark_step() at
    on_train_batch_end when the batch ran an optimizer step."""

    def __init__(self):
        super().__init__()
        self.frozen = 0  # parameters the shim took as read-only at the last train start
        self._global_step = None

    def on_train_start(self, trainer, pl_module):
        self.frozen = liboffload.mark_frozen(pl_module)
        self._global_step = getattr(trainer, "global_step", None)

    def on_train_batch_end(self, trainer, pl_module, *args, **kwargs):
        # Marks only a batch that moved trainer.global_step: under gradient accumulation a batch
        # that only accumulates is part of a step, and a mark there would split the step.
        step = getattr(trainer, "global_step", None)
        if step is not None and step == self._global_step:
            return
        self._global_step = step
        liboffload.mark_step()
