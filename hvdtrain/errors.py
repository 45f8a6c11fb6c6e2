"""The error that every layer raises for input that cannot work. It lives apart from config.py
so that low-level modules (data, losses, the wire protocol, the run lock) can raise it without
importing every option of a run."""


class ConfigError(ValueError):
    """An option has a value that cannot work. The message names the flag and the fix."""
