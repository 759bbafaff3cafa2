def test_port(twin_parity):
    twin_parity("twins.py:net", backends="jax,torch")


def test_misported(twin_parity):
    twin_parity("twins.py:net_misported", backends="jax,torch")
