"""The error a checkpoint that cannot be loaded raises, shared by the loaders of each weight format."""


class CheckpointError(ValueError):
    """The checkpoint's tensors do not fit the model its config.json describes."""


# How the line a runner writes to say why it ends begins: CHECKPOINT_REFUSED where its model's checkpoint cannot be
# loaded (a CheckpointError; the daemon tells the client the model cannot run, rather than that the server
# failed), FAILURE otherwise. A line, not an exit status: a group's launcher exits with the status of the rank
# that ended first, which is seldom the one that knows why.
CHECKPOINT_REFUSED = "refused: "
FAILURE = "error: "
