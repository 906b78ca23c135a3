"""User-facing errors: one line that names the file/key and says what to do."""


class VTGError(Exception):
    """An error whose message is meant for the user as-is (no traceback needed)."""


class ConfigError(VTGError):
    """Invalid configuration: unknown key, wrong type, out-of-range value, missing file."""
