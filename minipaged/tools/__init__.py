"""What is built around the engine, apart from it: the server (serve/), the chat
(chat.py), the benchmarks and the simulator (bench/, simulate/), the labs' graders
(lab/) and the pictures (viz/). The engine a student reads is the rest of minipaged/
(docs/reading.md); `python -m minipaged.serve` and the other commands enter here through
the doors beside it.
"""
