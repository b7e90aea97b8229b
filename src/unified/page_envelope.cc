#include "unified/page_envelope.h"

namespace ula {

Status PageEnvelopeLayout::Validate() const {
  if (page_tokens == 0) return MakeError(ErrorCode::kInvalidArgument, "page envelope: page_tokens must be > 0");
  if (num_layers == 0) return MakeError(ErrorCode::kInvalidArgument, "page envelope: num_layers must be > 0");
  if (k_bytes_per_token == 0) return MakeError(ErrorCode::kInvalidArgument, "page envelope: k_bytes_per_token must be > 0");
  if (v_bytes_per_token == 0) return MakeError(ErrorCode::kInvalidArgument, "page envelope: v_bytes_per_token must be > 0");
  return Ok();
}

}  // namespace ula
