"""spec_decode: speculative decoding of T5 models in the T5X ecosystem."""
import setuptools

setuptools.setup(
    name="spec_decode",
    version="0.1.0",
    description="Exact speculative decoding (Leviathan et al., 2023) for T5 in JAX/Flax, T5X-native.",
    packages=setuptools.find_packages(include=["spec_decode", "spec_decode.*"]),
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
    ],
    extras_require={
        "test": [
            "pytest",
            "scipy",
            "torch==2.13.0",
            "transformers",
        ],
    },
)
