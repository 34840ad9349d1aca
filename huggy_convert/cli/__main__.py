"""``python -m huggy_convert.cli``: the console script."""
from . import entry

entry()
