"""What both engines need of the machine they run on: the processor and its instruction sets (`cpu`), where
a forward pass's threads run (`placement`), llama.cpp's backends and buffers (`llama_cpp`) and a GGUF's
header (`gguf_header`). No model logic."""
