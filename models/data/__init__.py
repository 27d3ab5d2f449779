"""MNIST in the original IDX format: reading, the fixed validation split and the checksummed
download from mirrors."""
