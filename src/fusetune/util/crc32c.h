#pragma once
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord files checksum their
// records, and TensorFlow's "masked" form of it (a rotation plus a constant, so that a CRC of
// data that itself contains CRCs stays well distributed).
#include <cstddef>
#include <cstdint>

namespace fusetune {

uint32_t crc32c(const void* data, size_t size);
// ((crc >> 15) | (crc << 17)) + 0xa282ead8
uint32_t masked_crc32c(const void* data, size_t size);

}  // namespace fusetune
