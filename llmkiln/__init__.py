from importlib.metadata import version as _v
__version__ = "0.1.0"
