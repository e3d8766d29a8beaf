// cuda_shim.h: just enough CUDA to run the kernels of cuda/*.cu on a CPU, unchanged.
//
// minipaged/attention/emulated.py compiles one .cu file with this header (g++ or clang++, -std=c++20) into a
// shared library and launches its kernels through emu_launch(), the way cuLaunchKernel would.
// The tests run every kernel this way against the NumPy reference, on machines without a GPU;
// students can step through a kernel in gdb (MINIPAGED_EMULATE_DEBUG=1 builds with -O0 -g).
//
// How a launch runs: blocks one after another; inside a block, each CUDA thread is a fiber (a
// ucontext with a stack of its own) on the one OS thread. A fiber runs until it waits, at
// __syncthreads, __syncwarp or a shuffle, or returns; then the next runs. When every live thread
// concerned has arrived at a barrier, the barrier opens. Fibers run in a shuffled order each
// round, so a kernel that reads shared memory before the barrier that orders it gives wrong
// answers here too. Because blocks run one at a time, `static` is block-shared memory.
// What a GPU leaves undefined is an error here: threads waiting at different barriers (deadlock),
// a shuffle reached by only part of a warp, or after some of its lanes returned.
#pragma once
// macOS hides the (deprecated, still working) ucontext functions unless the X/Open level is set
// before the first system header (and _DARWIN_C_SOURCE keeps the rest of its headers whole);
// emulated.py also silences their deprecation warnings there.
#if defined(__APPLE__) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 600
#define _DARWIN_C_SOURCE
#endif
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// ---- the CUDA vocabulary the kernels use --------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

using std::max;
using std::min;

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
inline dim3 threadIdx, blockIdx, blockDim, gridDim;  // set before each fiber runs
constexpr int warpSize = 32;

// __half: the compiler's IEEE binary16 type; conversions round to nearest even, as on the GPU.
#if defined(__FLT16_MANT_DIG__)  // g++ 12+, clang 15+ (Xcode 15+); any clang on arm64
using __half = _Float16;
inline float __half2float(__half x) { return static_cast<float>(x); }
inline __half __float2half(float x) { return static_cast<__half>(x); }
#else
// An older clang on x86_64 (Debian 12's clang 14, Xcode 14 on an Intel Mac) has no _Float16:
// the same 16 bits (1 sign, 5 exponent, 10 mantissa), converted by hand. After F. Giesen's
// float_to_half_fast3_rtne / half_to_float (public domain).
struct __half {
    unsigned short bits;
};
inline unsigned as_bits(float x) { unsigned u; memcpy(&u, &x, 4); return u; }
inline float as_float(unsigned u) { float x; memcpy(&x, &u, 4); return x; }

inline float __half2float(__half h) {
    unsigned u = (h.bits & 0x7fffu) << 13;          // exponent and mantissa, in a float's place
    const unsigned exponent = u & (0x7c00u << 13);
    u += (127 - 15) << 23;                          // rebias the exponent
    if (exponent == 0x7c00u << 13) {                // inf or NaN: all exponent bits set
        u += (128 - 16) << 23;
    } else if (exponent == 0) {                     // zero or subnormal: let the FPU normalize
        u = as_bits(as_float(u + (1u << 23)) - as_float(113u << 23));
    }
    return as_float(u | (h.bits & 0x8000u) << 16);
}

inline __half __float2half(float x) {
    const unsigned sign = as_bits(x) & 0x80000000u;
    unsigned u = as_bits(x) ^ sign;
    unsigned short bits;
    if (u >= (127u + 16) << 23) {                   // |x| >= 65536: inf, or NaN stays NaN
        bits = u > 0x7f800000u ? 0x7e00 : 0x7c00;
    } else if (u < 113u << 23) {                    // a subnormal half (or zero): adding this
        const unsigned magic = (127 - 15 + 23 - 10 + 1) << 23;  // lines the 10 bits up at the
        bits = as_bits(as_float(u) + as_float(magic)) - magic;  // bottom, rounded by the FPU
    } else {                                        // normal: drop 13 bits, to nearest even
        u += ((15u - 127) << 23) + 0xfff + ((u >> 13) & 1);
        bits = u >> 13;                             // a carry past 65504 gives inf, as it should
    }
    return {static_cast<unsigned short>(bits | sign >> 16)};
}
#endif

namespace emu {

enum class Wait { none, syncthreads, warp, done };

struct Fiber {
    ucontext_t context;
    std::unique_ptr<char[]> stack;
    Wait wait = Wait::none;
    long warp_ops = 0;  // shuffles and __syncwarp calls so far: the lanes of a warp must agree
};

constexpr size_t STACK_SIZE = 256 * 1024;
inline ucontext_t scheduler;                // where a fiber returns when it waits
inline std::vector<Fiber> fibers;           // one per thread of the block, reused by every block
inline int current = 0;                     // the running fiber
inline void (*kernel)(void**) = nullptr;    // the launched kernel, behind its argument unpacker
inline void** kernel_args = nullptr;
inline std::string error;                   // the launch's first error
inline float shuffle_slots[2][1024];        // values being exchanged, one per thread, two sets

inline void set_thread_index(int i) {
    threadIdx = {i % blockDim.x, i / blockDim.x % blockDim.y, i / (blockDim.x * blockDim.y)};
}

// Park the running fiber at a barrier; the scheduler resumes it once the barrier opens.
inline void wait(Wait kind) {
    fibers[current].wait = kind;
    swapcontext(&fibers[current].context, &scheduler);
}

inline void fiber_main() {
    kernel(kernel_args);
    fibers[current].wait = Wait::done;
}  // returning resumes the scheduler (uc_link)

// Open the barriers at which every live thread concerned waits; false if none could open.
inline bool open_barriers(int num_threads) {
    auto live = [](const Fiber& f) { return f.wait != Wait::done; };
    if (std::all_of(fibers.begin(), fibers.begin() + num_threads,
                    [&](const Fiber& f) { return !live(f) || f.wait == Wait::syncthreads; })) {
        for (int i = 0; i < num_threads; i++)
            if (live(fibers[i])) fibers[i].wait = Wait::none;
        return true;
    }
    bool opened = false;
    for (int first = 0; first < num_threads; first += warpSize) {
        const int last = min(first + warpSize, num_threads);
        bool all_here = true, some_done = false;
        for (int i = first; i < last; i++) {
            some_done |= !live(fibers[i]);
            all_here &= !live(fibers[i]) || fibers[i].wait == Wait::warp;
        }
        if (!all_here || some_done) continue;  // some_done and all_here: reported as a deadlock
        for (int i = first; i < last; i++) {
            if (fibers[i].warp_ops != fibers[first].warp_ops) {
                error = "warp " + std::to_string(first / warpSize) +
                        ": its lanes are at different shuffles or __syncwarp calls "
                        "(a shuffle in code that only some lanes run?)";
                return false;
            }
            fibers[i].wait = Wait::none;
        }
        opened = true;
    }
    return opened;
}

inline void run_block(int num_threads, std::mt19937& rng) {
    for (int i = 0; i < num_threads; i++) {
        Fiber& f = fibers[i];
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = f.stack.get();
        f.context.uc_stack.ss_size = STACK_SIZE;
        f.context.uc_link = &scheduler;
        makecontext(&f.context, fiber_main, 0);
        f.wait = Wait::none;
        f.warp_ops = 0;
    }
    std::vector<int> order(num_threads);
    std::iota(order.begin(), order.end(), 0);
    while (true) {
        std::shuffle(order.begin(), order.end(), rng);
        for (int i : order) {
            if (fibers[i].wait != Wait::none) continue;
            current = i;
            set_thread_index(i);
            swapcontext(&scheduler, &fibers[i].context);
        }
        if (std::all_of(fibers.begin(), fibers.begin() + num_threads,
                        [](const Fiber& f) { return f.wait == Wait::done; }))
            return;
        if (!open_barriers(num_threads)) {
            if (error.empty())
                error = "deadlock: the threads wait at different barriers (a __syncthreads that "
                        "only some threads reach, or a shuffle after some lanes returned?)";
            return;
        }
    }
}

// ---- kernels, as the shared library offers them -------------------------------------------------

// Call a kernel with its arguments the way cuLaunchKernel takes them: args[i] points at argument i.
template <typename... Params>
void call(void (*kernel)(Params...), void** args) {
    [&]<size_t... I>(std::index_sequence<I...>) {
        kernel(*static_cast<std::remove_cvref_t<Params>*>(args[I])...);
    }(std::index_sequence_for<Params...>{});
}

template <auto KERNEL>
void run(void** args) {
    call(KERNEL, args);
}

template <typename... Params>
std::vector<int> param_sizes(void (*)(Params...)) {
    return {static_cast<int>(sizeof(Params))...};
}

struct Kernel {
    const char* name;              // the name expression, as CuPy's RawModule takes it
    void (*run)(void**);
    std::vector<int> param_sizes;  // checked against what the caller passes
};

template <auto KERNEL>
Kernel entry(const char* name) {
    return {name, &run<KERNEL>, param_sizes(KERNEL)};
}

extern const std::vector<Kernel> kernels;  // the instances compiled into this library

}  // namespace emu

// ---- barriers and shuffles, as the kernels call them --------------------------------------------

inline void __syncthreads() { emu::wait(emu::Wait::syncthreads); }

inline void __syncwarp(unsigned /*mask*/ = 0xffffffffu) {
    emu::fibers[emu::current].warp_ops++;
    emu::wait(emu::Wait::warp);
}

// A shuffle: each lane leaves its value in its slot and waits for its warp; then reads its
// partner's. The slots alternate between two sets: a lane that runs on to its next shuffle writes
// the other set, so slower lanes still read this one, and one barrier per shuffle is enough.
inline float __shfl_xor_sync(unsigned /*mask: all lanes, always*/, float value, int lane_mask,
                             int /*width*/ = warpSize) {
    const int lane = emu::current, set = emu::fibers[lane].warp_ops++ % 2;
    emu::shuffle_slots[set][lane] = value;
    emu::wait(emu::Wait::warp);
    return emu::shuffle_slots[set][lane ^ lane_mask];
}

// ---- the launch, called through ctypes: 0, or 1 with the error in `message` ---------------------

extern "C" int emu_launch(const char* name, const unsigned* grid, const unsigned* block,
                          void** args, int num_args, const int* arg_sizes, char* message,
                          int message_size) {
    using namespace emu;
    error.clear();
    auto found = std::find_if(kernels.begin(), kernels.end(),
                              [&](const Kernel& k) { return strcmp(k.name, name) == 0; });
    const int num_threads = static_cast<int>(block[0] * block[1] * block[2]);
    if (found == kernels.end()) {
        error = std::string("no kernel ") + name + " in this library";
    } else if (found->param_sizes != std::vector<int>(arg_sizes, arg_sizes + num_args)) {
        error = std::string(name) + ": the arguments passed do not match its parameters "
                "(their number or sizes differ)";
    } else if (num_threads < 1 || num_threads > 1024) {
        error = "a block has 1 to 1024 threads, not " + std::to_string(num_threads);
    }
    if (error.empty()) {
        gridDim = {grid[0], grid[1], grid[2]};
        blockDim = {block[0], block[1], block[2]};
        kernel = found->run;
        kernel_args = args;
        while (static_cast<int>(fibers.size()) < num_threads)
            fibers.push_back(Fiber{{}, std::make_unique<char[]>(STACK_SIZE)});
        std::mt19937 rng(2024);  // a fixed seed: a failure shows up again on the next run
        for (unsigned z = 0; z < grid[2] && error.empty(); z++)
            for (unsigned y = 0; y < grid[1] && error.empty(); y++)
                for (unsigned x = 0; x < grid[0] && error.empty(); x++) {
                    blockIdx = {x, y, z};
                    run_block(num_threads, rng);
                }
    }
    snprintf(message, message_size, "%s", error.c_str());
    return error.empty() ? 0 : 1;
}
