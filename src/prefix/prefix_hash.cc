// Block hashes of the prefix cache's events (ula/prefix_events.h): SGLang's SHA-256 chain
// (OpenSSL's EVP digest) or the project's StateDigest chain.
#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <memory>
#include <span>
#include <vector>

#include "core/digest.h"
#include "prefix/tree_util.h"
#include "ula/check.h"
#include "ula/prefix_events.h"

namespace ula {

const char* EventMediumName(EventMedium medium) { return medium == EventMedium::kDevice ? "GPU" : "CPU"; }

namespace internal {
namespace {

using Digest = std::array<unsigned char, 32>;

// SHA-256(prior digest, if any; each token as 4 bytes little-endian): SGLang's get_hash_str.
Digest Sha256Page(const Digest* prior, std::span<const std::uint32_t> tokens, EVP_MD_CTX* ctx) {
  ULA_CHECK(EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1);
  if (prior != nullptr) ULA_CHECK(EVP_DigestUpdate(ctx, prior->data(), prior->size()) == 1);
  std::vector<unsigned char> bytes(tokens.size() * 4);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    for (int k = 0; k < 4; ++k) bytes[i * 4 + k] = static_cast<unsigned char>(tokens[i] >> (8 * k));
  }
  ULA_CHECK(EVP_DigestUpdate(ctx, bytes.data(), bytes.size()) == 1);
  Digest d{};
  unsigned int len = 0;
  ULA_CHECK(EVP_DigestFinal_ex(ctx, d.data(), &len) == 1 && len == d.size());
  return d;
}

}  // namespace

std::vector<std::uint64_t> PageHashes(std::span<const std::uint32_t> tokens, std::uint32_t P, EventHash hash) {
  std::vector<std::uint64_t> hashes;
  if (hash == EventHash::kDebug) {
    std::uint64_t parent = 0;
    for (std::size_t i = 0; i < tokens.size(); i += P) {
      StateDigest d;
      d.Add(parent);
      d.AddAll(tokens.subspan(i, std::min<std::size_t>(P, tokens.size() - i)));
      parent = d.value();
      hashes.push_back(parent);
    }
    return hashes;
  }
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  ULA_CHECK(ctx != nullptr);
  Digest prior{};
  for (std::size_t i = 0; i < tokens.size(); i += P) {
    prior = Sha256Page(i == 0 ? nullptr : &prior, tokens.subspan(i, std::min<std::size_t>(P, tokens.size() - i)), ctx.get());
    std::uint64_t first = 0;  // hash_str_to_int64: the first 16 hex digits, big-endian
    for (int k = 0; k < 8; ++k) first = (first << 8) | prior[k];
    hashes.push_back(first);
  }
  return hashes;
}

}  // namespace internal

std::vector<std::int64_t> BlockHashes(std::span<const std::uint32_t> tokens, std::uint32_t page_tokens, EventHash hash) {
  std::vector<std::int64_t> out;
  for (std::uint64_t h : internal::PageHashes(tokens, page_tokens, hash)) out.push_back(static_cast<std::int64_t>(h));
  return out;
}

}  // namespace ula
