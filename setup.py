"""sage-tfx: Sage's block-level differential privacy for TFX pipelines.

The dependency stack is pinned in requirements.lock and installed with
``uv pip install --no-deps`` (see the Makefile); install_requires lists only
what the privacy core needs, so pip never tries to resolve the TFX stack.
"""

from setuptools import find_packages, setup

setup(
    name="sage-tfx",
    version="0.1.0",
    description="Differentially private TFX pipelines with a global privacy guarantee (Sage, SOSP 2019)",
    python_requires=">=3.11,<3.12",
    packages=["sage_tfx"]
    + ["sage_tfx." + p for p in find_packages("sage_tfx")]
    + ["sage_tfx.components", "sage_tfx.pipelines"]
    + ["sage_tfx.components." + p for p in find_packages("components")]
    + ["sage_tfx.pipelines." + p for p in find_packages("pipelines")],
    package_dir={
        "sage_tfx": "sage_tfx",
        "sage_tfx.components": "components",
        "sage_tfx.pipelines": "pipelines",
    },
    install_requires=["numpy", "dp-accounting", "cryptography"],
    entry_points={"console_scripts": ["sage = sage_tfx.cli:main"]},
)
