"""``python -m huggy_convert``: the console script ``huggy-convert`` (where the script's folder is not on
PATH, or to pick the interpreter: ``python3.12 -m huggy_convert ...``)."""
from .cli import entry

if __name__ == "__main__":
    entry()
