"""Installs bertjax. Extras: tpu, gpu, beam, bench, test."""

import setuptools

setuptools.setup(
    name="bertjax",
    version="0.1.0",
    description="BERT pretraining in JAX/Flax, TPU first.",
    packages=setuptools.find_packages(include=["bertjax", "bertjax.*"]),
    python_requires=">=3.11",
    install_requires=[
        # The attention kernels (Pallas) are verified on this range: interpret
        # mode and the TPU compile on 0.10.2, the GPU tests on 0.11.2
        # (docs/attention.md); auto's evidence is per minor release.
        "jax>=0.10.2,<0.12",
        "flax>=0.11",
        "optax>=0.2.5",
        "orbax-checkpoint>=0.11",
        "ml_collections>=1.0",
        "absl-py>=2.0",
        "numpy>=1.26",
        # tf.data only: bertjax hides every accelerator from TensorFlow.
        "tensorflow-cpu>=2.16",
        "tensorflow-datasets>=4.9",
        "sentencepiece>=0.2",
        # Hugging Face's compiled WordPiece tokenizer and trainer.
        "tokenizers>=0.15",
        # Sentence splitting of raw documents.
        "blingfire>=0.1.8",
        # Wikipedia dumps' wikitext read by its C tokenizer (the parser
        # TFDS's wikipedia uses); create_text renders its tokens.
        "mwparserfromhell>=0.6,<0.8",
        # TensorBoard event files without a TensorFlow dependency in the loop.
        "tensorboardX>=2.6",
        "tqdm>=4.60",
        # TFRecord CRC checks when the input pipeline reads records by offset.
        "google-crc32c>=1.5",
        # Fine-tuning metrics by their official definitions (GLUE, CoNLL-2003 spans).
        "scikit-learn>=1.3",
        "scipy>=1.10",
        "seqeval>=1.2",
        # Hugging Face weights (model.safetensors) in the export and init_from.
        "safetensors>=0.4",
    ],
    extras_require={
        "tpu": ["jax[tpu]"],
        "gpu": ["jax[cuda12]"],
        "beam": ["apache-beam>=2.50"],
        # The original release's create_pretraining_data.py, and
        # WikiExtractor for create_text's speed benchmark, for comparison.
        "bench": ["bert-tensorflow==1.0.4", "wikiextractor==3.1.0"],
        "test": [
            "pytest>=8",
            "pytest-xdist>=3",
            # The Colab notebook, run top to bottom by the tests.
            "nbclient>=0.10",
            "nbformat>=5.9",
            "ipykernel>=6.29",
            "matplotlib>=3.8",
            # Reference implementation for parity tests (Flax BERT, no PyTorch).
            "transformers>=4.40,<5",
            # The original release's tokenizer, data creation and input
            # function, for parity and interchange tests.
            "bert-tensorflow==1.0.4",
            # The Beam pipeline's test (also in the beam extra).
            "apache-beam>=2.50",
        ],
    },
    entry_points={
        "console_scripts": [
            "bertjax-train=bertjax.main:run",
            "bertjax-create-data=bertjax.create_data:run",
            "bertjax-create-text=bertjax.create_text:run",
        ],
    },
)
