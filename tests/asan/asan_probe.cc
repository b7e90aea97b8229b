// What the ASan tree's run-time defaults (tests/asan_default_options.cc) must not hide: a
// block read after it was freed, and after 4 MiB of blocks of its size were freed after it,
// is reported as a use after free. Blocks of its size are then allocated and kept: had the
// quarantine let the block go, its address would be handed out again and the read would not
// be reported as one (with ASAN_OPTIONS=quarantine_size_mb=0 it is reported as an overflow
// of a new block).
#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  constexpr int kBlock = 64;
  char* freed = new char[kBlock];
  std::memset(freed, 1, kBlock);
  delete[] freed;
  for (int i = 0; i < (4 << 20) / kBlock; ++i) delete[] new char[kBlock];
  std::vector<char*> kept;
  for (int i = 0; i < 4096; ++i) kept.push_back(new char[kBlock]);
  volatile char read = freed[3];  // heap-use-after-free
  std::printf("read %d: not reported\n", read);
  for (char* p : kept) delete[] p;
  return 0;
}
