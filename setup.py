"""pystrads: STRADS-style scheduled model-parallel machine learning on Apache Spark."""

import os
import re

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "pystrads", "__init__.py")) as fh:
    VERSION = re.search(r'__version__ = "([^"]+)"', fh.read()).group(1)
with open(os.path.join(HERE, "README.md"), encoding="utf-8") as fh:
    LONG_DESCRIPTION = fh.read()

setup(
    name="pystrads",
    version=VERSION,
    description="Scheduled model-parallel machine learning (STRADS) for PySpark: "
                "LDA, matrix factorisation and Lasso with parameter-server shards on the executors",
    long_description=LONG_DESCRIPTION,
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",
    packages=find_packages(include=["pystrads", "pystrads.*"]),
    package_data={"pystrads": ["datasets/data/*"]},
    include_package_data=True,
    install_requires=[
        "pyspark>=3.5",
        "numpy>=1.23",
        "numba>=0.57",
        "pandas>=1.5,<3",  # pyspark 4.x warns it does not fully support pandas 3
        "pyarrow>=14",
        # per-run TLS certificates for shards off the loopback (pystrads.ps.tls): the PyCA's
        # well-kept X.509 builder instead of hand-written ASN.1; pyarrow cannot make certificates
        "cryptography>=41",
        # shards forked from the Python daemon (pystrads.daemon) keep the command line of a new
        # interpreter in ps / pgrep -f / /proc: the maintained C module that rewrites it safely
        # (moving the environment aside first) instead of hand-written pointer surgery through ctypes
        "setproctitle>=1.2",
    ],
    extras_require={
        # matplotlib: the tests check the summaries' plots too; pytest-timeout: a hung test fails
        # with its stack instead of stalling the whole run; pyspark[connect]: the Spark Connect
        # tests start a local Connect server (grpcio and friends); scikit-learn: the Lasso tests
        # compare with its coordinate descent; nbclient, ipykernel and nbformat: the example notebook
        # runs in a real Jupyter kernel, as a notebook user's does, and is validated as nbformat;
        # sphinx, numpydoc and myst-parser: the API reference site is built and checked
        "test": ["pytest>=7", "pytest-timeout>=2.1", "matplotlib>=3.6", "pyspark[connect]>=3.5",
                 "scikit-learn>=1.3", "nbclient>=0.7", "ipykernel>=6.0", "nbformat>=5.7", "sphinx>=7",
                 "numpydoc>=1.6", "myst-parser>=2"],
        # the documentation site (docs/conf.py): what pyspark and scikit-learn build theirs with
        "docs": ["sphinx>=7", "numpydoc>=1.6", "myst-parser>=2"],
        "plot": ["matplotlib>=3.6"],
        # peers the benchmarks compare against (not needed by pystrads itself)
        "bench": ["matplotlib>=3.6", "scikit-learn>=1.3", "scipy>=1.9", "tomotopy>=0.12", "celer>=0.7",
                  "skglm>=0.4", "implicit>=0.7"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "License :: OSI Approved :: Apache Software License",
    ],
)
