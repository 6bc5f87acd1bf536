#include "fault_spec.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace simfault {
namespace {

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  size_t b = s.find_last_not_of(" \t\r\n");
  return s.substr(a, b - a + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t p = s.find(sep, start);
    out.push_back(s.substr(start, p == std::string::npos ? std::string::npos : p - start));
    if (p == std::string::npos) break;
    start = p + 1;
  }
  return out;
}

bool parse_nonneg_int(const std::string& s, int* out) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  *out = std::atoi(s.c_str());
  return true;
}

bool parse_kind(const std::string& s, Kind* k) {
  static const struct {
    const char* name;
    Kind kind;
  } kinds[] = {{"noncomm-hang", Kind::NonCommHang},
               {"comm-hang", Kind::CommHang},
               {"noncomm-slow", Kind::NonCommSlow},
               {"comm-slow", Kind::CommSlow},
               {"crash", Kind::Crash},
               {"mismatch", Kind::Mismatch}};
  for (const auto& e : kinds)
    if (s == e.name) {
      *k = e.kind;
      return true;
    }
  return false;
}

/* Parses one spec; returns "" on success or the reason it is malformed. */
std::string parse_one(const std::string& spec, Fault* f) {
  size_t at = spec.find('@');
  std::string kind = trim(spec.substr(0, at));
  if (!parse_kind(kind, &f->kind))
    return "unknown kind '" + kind +
           "' (expected noncomm-hang, comm-hang, noncomm-slow, comm-slow, crash or mismatch)";
  if (at == std::string::npos) return "missing '@key=value' (e.g. " + kind + "@rank=3)";
  bool seen_step = false, seen_factor = false, seen_dir = false, seen_until = false, seen_secs = false,
       seen_what = false;
  for (const std::string& raw : split(spec.substr(at + 1), ',')) {
    std::string kv = trim(raw);
    size_t eq = kv.find('=');
    if (eq == std::string::npos) return "'" + kv + "' is not key=value";
    std::string key = trim(kv.substr(0, eq)), val = trim(kv.substr(eq + 1));
    if (key == "rank") {
      if (f->rank >= 0 || f->link_a >= 0) return "more than one rank=/link=";
      if (!parse_nonneg_int(val, &f->rank)) return "rank=" + val + " is not a non-negative integer";
    } else if (key == "link") {
      if (f->rank >= 0 || f->link_a >= 0) return "more than one rank=/link=";
      size_t dash = val.find('-');
      if (dash == std::string::npos || !parse_nonneg_int(val.substr(0, dash), &f->link_a) ||
          !parse_nonneg_int(val.substr(dash + 1), &f->link_b))
        return "link=" + val + " is not R-S with two non-negative ranks";
      if (f->link_a == f->link_b) return "link=" + val + " joins a rank to itself";
    } else if (key == "step") {
      if (seen_step) return "step= given twice";
      seen_step = true;
      if (!parse_nonneg_int(val, &f->step)) return "step=" + val + " is not a non-negative integer";
    } else if (key == "factor") {
      if (seen_factor) return "factor= given twice";
      seen_factor = true;
      char* end = nullptr;
      errno = 0;
      double v = std::strtod(val.c_str(), &end);
      if (val.empty() || errno || *end || !std::isfinite(v) || v < 1.0)
        return "factor=" + val + " is not a number >= 1";
      f->factor = v;
    } else if (key == "dir") {
      if (seen_dir) return "dir= given twice";
      seen_dir = true;
      if (val == "both") f->dir = Dir::Both;
      else if (val == "fwd") f->dir = Dir::Fwd;
      else if (val == "rev") f->dir = Dir::Rev;
      else return "dir=" + val + " is not both, fwd or rev";
    } else if (key == "until") {
      if (seen_until) return "until= given twice";
      seen_until = true;
      if (!parse_nonneg_int(val, &f->until)) return "until=" + val + " is not a non-negative integer";
    } else if (key == "secs") {
      if (seen_secs) return "secs= given twice";
      seen_secs = true;
      char* end = nullptr;
      errno = 0;
      double v = std::strtod(val.c_str(), &end);
      if (val.empty() || errno || *end || !std::isfinite(v) || v <= 0.0 || v > 1e6)
        return "secs=" + val + " is not a number of seconds > 0";
      f->secs = v;
    } else if (key == "what") {
      if (seen_what) return "what= given twice";
      seen_what = true;
      if (val == "skip") f->what = What::Skip;
      else if (val == "op") f->what = What::Op;
      else if (val == "count") f->what = What::Count;
      else if (val == "dtype") f->what = What::Dtype;
      else if (val == "root") f->what = What::Root;
      else if (val == "count-hang") f->what = What::CountHang;
      else if (val == "dtype-hang") f->what = What::DtypeHang;
      else return "what=" + val + " is not skip, op, count, dtype, root, count-hang or dtype-hang";
    } else if (key == "node") {
      return "node= must be resolved to rank= by the launcher (c4d sim) before simnccl sees it";
    } else {
      return "unknown key '" + key + "' (expected rank, link, dir, step, until, secs, factor, what)";
    }
  }
  if (f->rank < 0 && f->link_a < 0) return "needs rank=R or link=R-S";
  if (f->link_a >= 0 && !is_comm_kind(f->kind)) return "link= applies to comm-hang and comm-slow only";
  if (seen_factor && !is_slow_kind(f->kind)) return "factor= applies to the slow kinds only";
  if (seen_dir && f->link_a < 0) return "dir= applies to link= faults only";
  if (seen_until && !is_slow_kind(f->kind)) return "until= applies to the slow kinds only";
  if (seen_until && f->until <= f->step) return "until= must be after step=";
  if (seen_secs && f->kind != Kind::NonCommHang) return "secs= applies to noncomm-hang only";
  if (f->kind == Kind::Mismatch && f->rank < 0) return "mismatch needs rank=R";
  if (seen_what && f->kind != Kind::Mismatch) return "what= applies to mismatch only";
  return "";
}

}  // namespace

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::NonCommHang: return "noncomm-hang";
    case Kind::CommHang: return "comm-hang";
    case Kind::NonCommSlow: return "noncomm-slow";
    case Kind::CommSlow: return "comm-slow";
    case Kind::Crash: return "crash";
    case Kind::Mismatch: return "mismatch";
  }
  return "?";
}

ParseResult parse_faults(const char* text) {
  ParseResult r;
  if (!text) return r;
  for (const std::string& raw : split(text, ';')) {
    std::string spec = trim(raw);
    if (spec.empty()) continue;
    Fault f;
    std::string why = parse_one(spec, &f);
    if (why.empty())
      r.faults.push_back(f);
    else
      r.errors.push_back("SIMNCCL_FAULTS: ignoring malformed spec '" + spec + "': " + why);
  }
  return r;
}

}  // namespace simfault
