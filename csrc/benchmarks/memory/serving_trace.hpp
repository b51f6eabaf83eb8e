#pragma once
// A synthetic variable-length serving trace: requests with lognormal lengths arrive under a
// load that swings up and down; each step assembles a batch, allocates its input, nested
// per-layer activations and an output staging buffer; requests hold a session block (grown
// now and then, as a KV cache would) and a small token buffer until they finish.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace latte::bench {

struct TraceOp {
  std::uint32_t id;     // allocation identity
  std::uint64_t bytes;  // size for an allocation, 0 for a free
};

struct ServingTraceConfig {
  std::uint64_t seed = 7;
  std::size_t min_ops = 1'000'000;
  std::uint64_t hidden_bytes = 1024;  // bytes per token of one activation (fp16, 512 wide)
  int layers = 8;
  std::uint64_t session_bytes_per_token = 8 * 1024;
  std::uint64_t batch_token_budget = 8192;
  double mean_concurrency = 48;
};

inline std::vector<TraceOp> make_serving_trace(const ServingTraceConfig& cfg) {
  std::mt19937_64 rng(cfg.seed);
  std::lognormal_distribution<double> prompt_len(std::log(256.0), 1.0);
  std::lognormal_distribution<double> decode_steps(std::log(48.0), 0.8);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<TraceOp> ops;
  ops.reserve(cfg.min_ops + 1024);
  std::uint32_t next_id = 0;
  auto alloc = [&](std::uint64_t bytes) {
    ops.push_back({next_id, std::max<std::uint64_t>(bytes, 1)});
    return next_id++;
  };
  auto release = [&](std::uint32_t id) { ops.push_back({id, 0}); };

  struct Request {
    std::uint64_t tokens;
    int steps_left;
    bool prefilled;
    std::uint32_t session;
    std::uint32_t token_ids;
    std::uint64_t session_tokens;
  };
  std::vector<Request> active;
  for (std::uint64_t step = 0; ops.size() < cfg.min_ops; ++step) {
    // Load swings between ~0.4x and ~1.6x of the mean over a 2000-step period.
    const double load = cfg.mean_concurrency * (1.0 + 0.6 * std::sin(double(step) * 2 * M_PI / 2000.0));
    while (double(active.size()) < load && unit(rng) < 0.5) {
      Request r;
      r.tokens = std::clamp<std::uint64_t>(std::uint64_t(prompt_len(rng)), 8, 8192);
      r.steps_left = std::max(1, int(decode_steps(rng)));
      r.prefilled = false;
      r.session_tokens = r.tokens + 32;
      r.session = alloc(r.session_tokens * cfg.session_bytes_per_token);
      r.token_ids = alloc(r.tokens * 4);
      active.push_back(r);
    }
    if (active.empty()) continue;
    // Batch: prefill of new requests within the token budget, one token for the others.
    std::uint64_t batch_tokens = 0;
    std::size_t batch_size = 0;
    for (Request& r : active) {
      const std::uint64_t t = r.prefilled ? 1 : r.tokens;
      if (batch_tokens + t > cfg.batch_token_budget && batch_tokens > 0) continue;
      batch_tokens += t;
      ++batch_size;
      r.prefilled = true;
      --r.steps_left;
    }
    const std::uint32_t input = alloc(batch_tokens * cfg.hidden_bytes);
    std::uint32_t residual = alloc(batch_tokens * cfg.hidden_bytes);
    for (int layer = 0; layer < cfg.layers; ++layer) {
      const std::uint32_t qkv = alloc(batch_tokens * cfg.hidden_bytes * 3);
      const std::uint32_t scores = alloc(batch_size * 64 * 64 * 4);
      release(scores);
      release(qkv);
      const std::uint32_t mlp = alloc(batch_tokens * cfg.hidden_bytes * 4);
      const std::uint32_t out = alloc(batch_tokens * cfg.hidden_bytes);
      release(mlp);
      release(residual);
      residual = out;
    }
    const std::uint32_t staging = alloc(batch_size * 32000 * 2);  // logits for the batch
    release(input);
    release(residual);
    release(staging);
    // Session blocks grow in chunks of 64 tokens: allocate the bigger block, free the old.
    for (Request& r : active) {
      if (r.prefilled && unit(rng) < 1.0 / 32) {
        const std::uint32_t grown = alloc((r.session_tokens + 64) * cfg.session_bytes_per_token);
        release(r.session);
        r.session = grown;
        r.session_tokens += 64;
      }
    }
    for (std::size_t i = 0; i < active.size();) {
      if (active[i].steps_left <= 0) {
        release(active[i].session);
        release(active[i].token_ids);
        active[i] = active.back();
        active.pop_back();
      } else {
        ++i;
      }
    }
  }
  for (const Request& r : active) {
    release(r.session);
    release(r.token_ids);
  }
  return ops;
}

// Peak of the sum of live requested bytes over the trace.
inline std::uint64_t peak_live_bytes(const std::vector<TraceOp>& ops) {
  std::vector<std::uint64_t> size_of;
  std::uint64_t live = 0, peak = 0;
  for (const TraceOp& op : ops) {
    if (op.id >= size_of.size()) size_of.resize(op.id + 1, 0);
    if (op.bytes) {
      size_of[op.id] = op.bytes;
      live += op.bytes;
      peak = std::max(peak, live);
    } else {
      live -= size_of[op.id];
    }
  }
  return peak;
}

}  // namespace latte::bench
