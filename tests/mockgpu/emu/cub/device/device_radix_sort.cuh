// device_radix_sort.cuh (emulated) — CUB's DeviceRadixSort::SortPairs for kernels/encoder.cu
// under the mock GPU: a stable sort on the host by the same key bits, queued in stream order.
// Checks what the real one needs: the sizing call first (temp_storage_bytes at least what it
// returned), device pointers with room for n keys and values, temp storage inside one
// allocation; and, stricter than CUB, that no key has a bit at or above end_bit (the caller
// sorts only the bits its keys can have, as encoder.cu sorts tokens by their vocabulary's: a key
// above would be left among keys it does not equal). Not modelled: CUB's real temp size and its
// use of the temp storage, the DoubleBuffer overloads, segmented and descending sorts.
#pragma once
#include <algorithm>
#include <cuda_runtime.h>
#include <numeric>
#include <type_traits>
#include <vector>
namespace cub {
struct DeviceRadixSort {
    static size_t need(size_t n) { return 4096 + n * 16; }
    template <class K, class V> struct job { const K *ki; K *ko; const V *vi; V *vo; size_t n; int b0, b1; };
    template <class K, class V> static void run(void *p) {
        job<K, V> *j = (job<K, V> *)p;
        typedef typename std::make_unsigned<K>::type U;
        auto key = [&](size_t i) { // bits [b0, b1) of the key, signed keys flipped to sort as CUB does
            U u = (U)j->ki[i];
            if (std::is_signed<K>::value) u ^= (U)1 << (8 * sizeof(K) - 1);
            unsigned w = (unsigned)(j->b1 - j->b0);
            return w >= 8 * sizeof(U) ? (U)(u >> j->b0) : (U)((u >> j->b0) & (((U)1 << w) - 1));
        };
        if (j->b1 < (int)(8 * sizeof(K)))
            for (size_t i = 0; i < j->n; i++)
                if ((U)j->ki[i] >> j->b1) {
                    mock_report("cub::DeviceRadixSort::SortPairs: key %lld (at %zu) has bits at or above end_bit %d, "
                                "which the sort ignores", (long long)j->ki[i], i, j->b1);
                    break;
                }
        std::vector<size_t> o(j->n);
        std::iota(o.begin(), o.end(), 0);
        std::stable_sort(o.begin(), o.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
        std::vector<K> ko(j->n);
        std::vector<V> vo(j->n);
        for (size_t i = 0; i < j->n; i++) {
            ko[i] = j->ki[o[i]];
            vo[i] = j->vi[o[i]];
        }
        std::copy(ko.begin(), ko.end(), j->ko);
        std::copy(vo.begin(), vo.end(), j->vo);
        delete j;
    }
    template <class K, class V, class N>
    static cudaError_t SortPairs(void *tmp, size_t &bytes, const K *ki, K *ko, const V *vi, V *vo, N n, int b0 = 0,
                                 int b1 = (int)(8 * sizeof(K)), cudaStream_t s = 0) {
        if (!tmp) {
            bytes = need((size_t)n);
            return cudaSuccess;
        }
        if (bytes < need((size_t)n)) {
            mock_report("cub::DeviceRadixSort::SortPairs: temp_storage_bytes %zu < the %zu the sizing call returned",
                        bytes, need((size_t)n));
            return cudaErrorInvalidValue;
        }
        if ((size_t)n == 0) return cudaSuccess;
        if (mock_check_dev_range(tmp, bytes, "SortPairs temp storage") ||
            mock_check_dev_range(ki, n * sizeof(K), "SortPairs keys_in") ||
            mock_check_dev_range(ko, n * sizeof(K), "SortPairs keys_out") ||
            mock_check_dev_range(vi, n * sizeof(V), "SortPairs values_in") ||
            mock_check_dev_range(vo, n * sizeof(V), "SortPairs values_out"))
            return cudaErrorInvalidValue;
        mock_enqueue_fn((void *)s, "cub_DeviceRadixSort", run<K, V>, new job<K, V>{ki, ko, vi, vo, (size_t)n, b0, b1});
        return cudaSuccess;
    }
};
} // namespace cub
