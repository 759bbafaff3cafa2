"""Named run specs. `gpt-tiny` is the CPU default of `python -m compare`."""
from common.spec import CNNSpec, DataSpec, MLPSpec, MeshSpec, RunSpec, TrainSpec, TransformerSpec

PRESETS: dict[str, RunSpec] = {
    # 784 -> 256 -> 256 -> 10 on a synthetic teacher task (MNIST-sized inputs).
    "mlp-tiny": RunSpec(
        name="mlp-tiny",
        model=MLPSpec(input_size=784, hidden_sizes=(256, 256), num_classes=10, activation="relu"),
        train=TrainSpec(optimizer="adamw", lr=1e-3, global_batch_size=128, steps=50),
        data=DataSpec(dataset="synthetic-classification"),
    ),
    # Two convs (the second at stride 2) on the real 8x8 digits of scikit-learn.
    "cnn-digits": RunSpec(
        name="cnn-digits",
        model=CNNSpec(input_shape=(8, 8, 1), channels=(16, 32), kernel_sizes=(3, 3), strides=(1, 2),
                      paddings=(1, 1), pooling="global_avg", num_classes=10),
        train=TrainSpec(optimizer="adamw", lr=3e-3, global_batch_size=64, steps=50),
        data=DataSpec(dataset="digits"),
    ),
    # The CPU default: small enough that both twins train 50 steps in seconds.
    "gpt-tiny": RunSpec(
        name="gpt-tiny",
        model=TransformerSpec(vocab_size=256, seq_len=64, d_model=64, n_heads=4, n_layers=2, d_ff=256,
                              layernorm_eps=1e-5, gelu="tanh", tied_embeddings=True),
        train=TrainSpec(optimizer="adamw", lr=3e-3, weight_decay=0.1, beta2=0.95, schedule="warmup_cosine",
                        schedule_warmup_steps=5, global_batch_size=16, steps=50),
        data=DataSpec(dataset="synthetic-tokens"),
    ),
    # GPT-2 small (124M) for TPU: bf16 and the platform's default matmul pass.
    "gpt2-small": RunSpec(
        name="gpt2-small",
        model=TransformerSpec(vocab_size=50257, seq_len=1024, d_model=768, n_heads=12, n_layers=12, d_ff=3072,
                              layernorm_eps=1e-5, gelu="tanh", tied_embeddings=True),
        train=TrainSpec(optimizer="adamw", lr=6e-4, weight_decay=0.1, beta2=0.95, schedule="warmup_cosine",
                        schedule_warmup_steps=10, global_batch_size=32, steps=100, timing_warmup_steps=5,
                        dtype="bfloat16", matmul_precision="default"),
        mesh=MeshSpec(),
        data=DataSpec(dataset="synthetic-tokens"),
    ),
}
