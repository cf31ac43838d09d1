"""liboffload in a Hugging Face Trainer:

    from liboffload.integrations.hf import OffloadCallback
    trainer = Trainer(model=model, args=args, ..., callbacks=[OffloadCallback()])

marks the frozen parameters (requires_grad False) read-only when training begins and each
optimizer step's end. Without the preloaded shim both are no-ops.
"""

try:
    from transformers import TrainerCallback
except ImportError as e:
    raise ImportError(
        f"liboffload.integrations.hf needs the transformers package (pip install transformers): {e}",
        name="transformers") from e

import liboffload

__all__ = ["OffloadCallback"]


class OffloadCallback(TrainerCallback):
    """Calls liboffload.mark_frozen(model) at on_train_begin and liboffload.mark_step() at
    on_step_end (once per optimizer step: the Trainer's gradient accumulation substeps are
    on_substep_end)."""

    def __init__(self):
        super().__init__()
        self.frozen = 0  # parameters the shim took as read-only at the last train begin

    # Each hook returns None: a returned value would replace the Trainer's TrainerControl.
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None:
            self.frozen = liboffload.mark_frozen(model)

    def on_step_end(self, args, state, control, **kwargs):
        liboffload.mark_step()
