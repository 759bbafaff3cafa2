"""The UNet denoiser example twin: a DDPM-style noise predictor on (noisy image, timestep), its
batches a numpy function (batches.py) and its loss written once per framework, the mean squared
error against the noise.

    python -m compare --twin examples/unet_denoiser/twin.py:unet_tiny --backend all
    # fails at encoder.0.resample
    python -m compare --twin examples/unet_denoiser/twin.py:unet_same_padding_down
    # fails at encoder.0.res.gn_a
    python -m compare --twin examples/unet_denoiser/twin.py:unet_groupnorm_eps

The torch side is NCHW, the NNX port NHWC: the twin transposes the images and the noise (the loss's
key) for the NNX side; the timesteps go as they are.
"""

import dataclasses

from common.spec import DataSpec, TrainSpec
from common.twin import Twin

NHWC = (0, 2, 3, 1)

unet_tiny = Twin(
    torch="torch_unet.py:unet",
    nnx="nnx_unet.py:unet",
    task="custom",
    hparams={
        "in_channels": 3,
        "image_size": 16,
        "base_width": 16,
        "channel_mults": (1, 2),
        "groups": 8,
    },
    data=DataSpec(dataset="batches", path="batches.py:denoising_batch"),
    loss={"torch": "torch_unet.py:mse_loss", "nnx": "nnx_unet.py:mse_loss"},
    loss_keys=("noise",),  # the forward takes x and t; only the loss reads the noise
    ranges={"t": (0, 1000)},
    nnx_input_axes={"x": NHWC, "noise": NHWC},
    nnx_output_axes=(0, 3, 1, 2),  # the port predicts NHWC noise
    rename={
        r"^time_embed\.0\.": "time_mlp.dense1.",
        r"^time_embed\.2\.": "time_mlp.dense2.",
        r"^conv_in\.": "stem.",
        r"^down_blocks\.(\d+)\.": r"encoder.\1.res.",
        r"^downsamples\.(\d+)\.": r"encoder.\1.resample.",
        r"^mid_block\.": "middle.",
        r"^up_blocks\.(\d+)\.": r"decoder.\1.res.",
        r"^upsamples\.(\d+)\.": r"decoder.\1.resample.",
        r"^norm_out\.": "head_norm.",
        r"^conv_out\.": "head.",
        r"\.norm1\.": ".gn_a.",
        r"\.norm2\.": ".gn_b.",
        r"\.conv1\.": ".conv_a.",
        r"\.conv2\.": ".conv_b.",
        r"\.temb_proj\.": ".time_proj.",
        r"\.skip\.": ".shortcut.",
    },
    train=TrainSpec(optimizer="adamw", lr=1e-3, global_batch_size=8, steps=6),
)

unet_same_padding_down = dataclasses.replace(unet_tiny, nnx="nnx_unet.py:unet_same_padding_down")
unet_groupnorm_eps = dataclasses.replace(unet_tiny, nnx="nnx_unet.py:unet_groupnorm_eps")
