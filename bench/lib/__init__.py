"""What the bench scripts share: their command lines and runs (common), servers and
processes (processes), llama.cpp's tools (llamacpp_build), the soak's requests and report.
What benches share with the tests (simulated generations) is in harness/ at the root."""
