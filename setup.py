"""spec_decode: speculative decoding of T5 models in the T5X ecosystem."""
import setuptools

T5X_DEPENDENCIES = ["absl-py", "cached_property", "chex", "clu", "fiddle", "gin-config", "jaxtyping",
                    "optax", "orbax-checkpoint", "seqio==0.0.20", "tensorstore", "tensorboard",
                    "grain"]

setuptools.setup(
    name="spec_decode",
    version="0.1.0",
    description="Exact speculative decoding (Leviathan et al., 2023) for T5 in JAX/Flax, T5X-native.",
    # The top-level configs/ ships inside the package as spec_decode/configs (spec_decode.paths
    # finds it in either place), with the demo pair and the CPU kernel's source (compiled on
    # first use): a plain `pip install .` runs its defaults from any folder.
    packages=[*setuptools.find_packages(include=["spec_decode", "spec_decode.*"]),
              "spec_decode.configs"],
    package_dir={"spec_decode.configs": "configs"},
    package_data={"spec_decode": ["assets/demo/*", "t5/*.cc"],
                  "spec_decode.configs": ["**/*.gin"]},
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
        # What `t5x` (not on the registry; scripts/test.sh installs it from ../shared/wheels)
        # imports, for the T5X hook (spec_decode.t5x). tensorboard is an undeclared import of
        # t5x.checkpoints; t5x's own `tensorflow-cpu` is left out: seqio brings `tensorflow`.
        "t5x": T5X_DEPENDENCIES,
        "test": [
            "matplotlib",
            "pytest",
            "pytest-xdist",
            "scipy",
            "torch==2.13.0",
            "transformers",
            "seqio==0.0.20",
            *T5X_DEPENDENCIES,
        ],
    },
)
