#pragma once
// The NumPy C API, shared by every bindings file of _native. Its function table is imported
// once, by module.cpp (which defines LATTE_NUMPY_IMPORTS_TABLE before including this).
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL latte_native_ARRAY_API
#ifndef LATTE_NUMPY_IMPORTS_TABLE
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

// NumPy 2's headers hide the descriptor's fields behind accessors (1.x headers lack them), so a
// build against either numpy works: the device machines build against numpy 2.
#if NPY_ABI_VERSION < 0x02000000
#define PyDataType_ELSIZE(descr) ((descr)->elsize)
#endif
