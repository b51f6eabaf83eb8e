#include "latte/build_info.hpp"

#ifndef LATTE_VERSION
#define LATTE_VERSION "0.1.0"
#endif

namespace latte {

BuildInfo build_info() {
  BuildInfo info;
  info.version = LATTE_VERSION;
#if defined(__clang__)
  info.compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
  info.compiler = "gcc " __VERSION__;
#else
  info.compiler = "unknown";
#endif
#ifdef LATTE_DEBUG_CHECKS
  info.debug_checks = true;
#else
  info.debug_checks = false;
#endif
#ifdef LATTE_WITH_CUDA
  info.cuda = true;
#else
  info.cuda = false;
#endif
  return info;
}

}  // namespace latte
