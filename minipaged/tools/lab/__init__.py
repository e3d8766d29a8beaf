"""Labs (`python -m minipaged.lab`): a participant rewrites one piece of the engine from
a starter in labs/ (a page table, fork, the prefix cache, the batcher, the kernel's
lookup); a check grades it by its properties, then plugs it into the engine to serve the
model.
"""
