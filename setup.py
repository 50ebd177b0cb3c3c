"""spec_decode: speculative decoding of T5 models in the T5X ecosystem."""
import setuptools

setuptools.setup(
    name="spec_decode",
    version="0.1.0",
    description="Exact speculative decoding (Leviathan et al., 2023) for T5 in JAX/Flax, T5X-native.",
    packages=setuptools.find_packages(include=["spec_decode", "spec_decode.*"]),
    # Configs and the demo pair ship inside the package: a plain `pip install .` finds them.
    package_data={"spec_decode": ["assets/demo/*", "configs/**/*.gin"]},
    python_requires=">=3.11,<3.12",
    install_requires=[
        "jax[cpu]>=0.10,<0.11",
        "flax",
        "optax",
        "gin-config",
        "numpy",
        "msgpack",
        "tensorstore",
        "sentencepiece",
        "safetensors",
        "sacrebleu",
    ],
    extras_require={
        # seqio tasks (they pull in TensorFlow); the engine, network and models do not need them.
        "tasks": ["seqio==0.0.20"],
        # scripts/reproduce_table2.py's plot.
        "plot": ["matplotlib"],
        "test": [
            "matplotlib",
            "pytest",
            "scipy",
            "torch==2.13.0",
            "transformers",
            "seqio==0.0.20",
        ],
    },
)
