"""thrust-remote: take an RL job from a laptop to a GPU box over SSH and get a model back."""

__version__ = "0.1.0"
