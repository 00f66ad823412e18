// Expected strings are CPython's repr() / f-string output for the same doubles.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "fusetune/metrics/format.h"

using namespace fusetune;

TEST(MetricsFormat, PythonFloatReprOfLearningRates) {
  EXPECT_EQ(python_float_repr(2e-05), "2e-05");
  EXPECT_EQ(python_float_repr(3.6e-05), "3.6e-05");
  EXPECT_EQ(python_float_repr(1e-05), "1e-05");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(0.00015), "0.00015");
  EXPECT_EQ(python_float_repr(3e-4), "0.0003");
  EXPECT_EQ(python_float_repr(0.001), "0.001");
  EXPECT_EQ(python_float_repr(1.5e-10), "1.5e-10");
  // Schedule outputs: full shortest round-trip digits, as Python prints them.
  EXPECT_EQ(python_float_repr(2e-5 * 0.9996954135095479), "1.999390827019096e-05");
  EXPECT_EQ(python_float_repr(2e-5 * 0.1), "2.0000000000000003e-06");
  EXPECT_EQ(python_float_repr(1e-4 * 0.5 * (1 + std::cos(M_PI * 0.3))), "7.938926261462366e-05");
}

// Step lines: a schedule's learning rate to 4 significant digits, as a person reads it.
TEST(MetricsFormat, RoundedReprOfLearningRates) {
  EXPECT_EQ(python_float_repr_rounded(0.0024000000000000002, 4), "0.0024");
  EXPECT_EQ(python_float_repr_rounded(0.0028144600200657953, 4), "0.002814");
  EXPECT_EQ(python_float_repr_rounded(1.1827948028283354e-05, 4), "1.183e-05");
  EXPECT_EQ(python_float_repr_rounded(2e-5 * 0.9996954135095479, 4), "1.999e-05");
  EXPECT_EQ(python_float_repr_rounded(2e-5 * 0.1, 4), "2e-06");
  EXPECT_EQ(python_float_repr_rounded(3.6e-05, 4), "3.6e-05");
  EXPECT_EQ(python_float_repr_rounded(9.99996e-05, 4), "0.0001");
  EXPECT_EQ(python_float_repr_rounded(0.003, 4), "0.003");
  EXPECT_EQ(python_float_repr_rounded(1.0, 4), "1.0");
  EXPECT_EQ(python_float_repr_rounded(12345.678, 4), "12350.0");
  EXPECT_EQ(python_float_repr_rounded(-0.0024000000000000002, 4), "-0.0024");
  EXPECT_EQ(python_float_repr_rounded(0.0, 4), "0.0");
  EXPECT_EQ(python_float_repr_rounded(std::nan(""), 4), "nan");
  EXPECT_EQ(python_float_repr_rounded(std::numeric_limits<double>::infinity(), 4), "inf");
}

TEST(MetricsFormat, PythonFloatReprGeneralCases) {
  EXPECT_EQ(python_float_repr(0.0), "0.0");
  EXPECT_EQ(python_float_repr(-0.0), "-0.0");
  EXPECT_EQ(python_float_repr(1.0), "1.0");
  EXPECT_EQ(python_float_repr(0.5), "0.5");
  EXPECT_EQ(python_float_repr(100.0), "100.0");
  EXPECT_EQ(python_float_repr(123.456), "123.456");
  EXPECT_EQ(python_float_repr(-2e-05), "-2e-05");
  EXPECT_EQ(python_float_repr(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(python_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(12345678901234567.0), "1.2345678901234568e+16");
  EXPECT_EQ(python_float_repr(5e-324), "5e-324");
  EXPECT_EQ(python_float_repr(1.7976931348623157e+308), "1.7976931348623157e+308");
  EXPECT_EQ(python_float_repr(std::nan("")), "nan");
  EXPECT_EQ(python_float_repr(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(python_float_repr(-std::numeric_limits<double>::infinity()), "-inf");
}

TEST(MetricsFormat, FixedDecimals) {
  EXPECT_EQ(format_fixed(1.97456, 4), "1.9746");
  EXPECT_EQ(format_fixed(1044.7812, 2), "1044.78");
  EXPECT_EQ(format_fixed(2.0, 4), "2.0000");
  EXPECT_EQ(format_fixed(std::nan(""), 4), "nan");
  EXPECT_EQ(format_fixed(std::numeric_limits<double>::infinity(), 2), "inf");
  EXPECT_EQ(format_fixed(1e300, 2).size(), 304u);
}
