// Stands in for CUDA's cuda_fp16.h when cuda/*.cu are compiled for the CPU: the shim, included
// first, already defines __half and its conversions (see cuda_shim.h).
#pragma once
#include "cuda_shim.h"
