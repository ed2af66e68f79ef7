"""What the bench scripts share: their command lines and runs (common), servers and
processes (processes), llama.cpp's tools (llamacpp_build), the soak's requests and report,
and simulated generations on measured costs (simulated)."""
