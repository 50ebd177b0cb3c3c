"""spec_decode: speculative decoding of T5 models in the T5X ecosystem."""
import setuptools

T5X_DEPENDENCIES = ["absl-py", "cached_property", "chex", "clu", "fiddle", "gin-config", "jaxtyping",
                    "optax", "orbax-checkpoint", "seqio==0.0.20", "tensorstore", "tensorboard",
                    "grain"]
# What the tests import on every supported Python; the Hugging Face parity tests add torch and
# transformers ("test").
TEST_CORE_DEPENDENCIES = ["matplotlib", "pytest", "pytest-xdist", "scipy", "seqio==0.0.20",
                          "huggingface_hub", *T5X_DEPENDENCIES]

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
    # Tested at both ends (.ci/run): Python 3.11 with JAX 0.10, and Python 3.12 with the newest
    # JAX (scripts/test_newest.sh). JAX 0.11 and newer need Python 3.12.
    python_requires=">=3.11,<3.14",
    install_requires=[
        # Plain `jax` brings the CPU jaxlib; TPU and GPU users install `jax[tpu]` or
        # `jax[cuda12]` / `jax[cuda13]` of the same version over it.
        "jax>=0.10,<0.13",
        "flax>=0.12.8,<0.13",
        "optax>=0.2.8",
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
        # Checkpoints named by Hugging Face Hub ids (hf://ORG/NAME), through the Hub's cache.
        "hub": ["huggingface_hub"],
        # scripts/reproduce_table2.py's plot.
        "plot": ["matplotlib"],
        # What `t5x` (not on the registry; scripts/test.sh installs it from ../shared/wheels)
        # imports, for the T5X hook (spec_decode.t5x). tensorboard is an undeclared import of
        # t5x.checkpoints; t5x's own `tensorflow-cpu` is left out: seqio brings `tensorflow`.
        "t5x": T5X_DEPENDENCIES,
        # The whole suite. torch 2.13.0 is the CPU build this project's machines keep on disk for
        # Python 3.11; on other Pythons the registry has only CUDA builds of several GB, so there
        # use "test-core" (the Hugging Face parity tests then skip and say so).
        "test": [*TEST_CORE_DEPENDENCIES, "torch==2.13.0", "transformers"],
        "test-core": TEST_CORE_DEPENDENCIES,
    },
)
