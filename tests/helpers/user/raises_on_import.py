"""A user module with a bug at import time: hvdtrain must show this file's traceback."""

SETTINGS = {"width": 32}
WIDTH = SETTINGS["depth"]  # the user's bug: a KeyError on import


def build():
    raise AssertionError("never reached")
