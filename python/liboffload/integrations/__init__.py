"""Training-loop callbacks that mark steps and frozen weights for liboffload.

    liboffload.integrations.hf.OffloadCallback          a transformers TrainerCallback
    liboffload.integrations.lightning.OffloadCallback   a Lightning Callback

Each module imports its framework; this package imports none, so that `import liboffload`
stays free of them.
"""
