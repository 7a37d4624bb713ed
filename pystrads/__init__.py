"""pystrads: STRADS-style scheduled model-parallel machine learning on Apache Spark."""

__version__ = "0.1.0"


def lazy_exports(package: str, exports: dict):
    """``(__getattr__, __dir__)`` for a package whose public names load on first use:
    ``exports`` maps each name to the submodule (relative, ``".driver"``) that defines it."""
    import sys
    from importlib import import_module

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
