# Every dependency comes from a Debian package installed by scripts/install-deps.sh.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(GTest REQUIRED)
find_package(benchmark REQUIRED)
find_package(gflags REQUIRED)
# libcrypto: hiberd's module cache keys code images by their SHA-256. libssl: hiber-inject serves
# HTTPS (containers/webhook).
find_package(OpenSSL REQUIRED COMPONENTS Crypto SSL)

# glog 0.6 ships a CMake config; fall back to pkg-config where it does not.
find_package(glog 0.6 QUIET)
if(NOT TARGET glog::glog)
  pkg_check_modules(GLOG REQUIRED IMPORTED_TARGET libglog)
  add_library(glog::glog ALIAS PkgConfig::GLOG)
endif()

pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
pkg_check_modules(LZ4 REQUIRED IMPORTED_TARGET liblz4)
# elfutils libelf: hiber-coverage reads programs' dynamic symbols and version needs.
pkg_check_modules(LIBELF REQUIRED IMPORTED_TARGET libelf)

# hiber-router: Boost.Beast/Asio (header-only) for HTTP, nlohmann/json for JSON bodies,
# prometheus-cpp for /metrics (core for the registry; pull's Exposer serves hiberd's port).
find_package(Boost 1.74 REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(prometheus-cpp REQUIRED COMPONENTS core pull)
