"""The error a checkpoint that cannot be loaded raises, shared by the loaders of each weight format."""


class CheckpointError(ValueError):
    """The checkpoint's tensors do not fit the model its config.json describes."""


# The runner's exit status when its model's checkpoint cannot be loaded (a CheckpointError): the daemon tells the
# client the model cannot run, rather than that the server failed.
CHECKPOINT_REFUSED = 3
