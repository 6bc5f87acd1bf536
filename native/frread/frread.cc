// frread: one PyTorch Flight Recorder dump (a pickle) straight to the columns c4d imports.
//
// Python's unpickler builds every entry's dicts, lists, strings and stack frames as Python
// objects, and then frees them; c4d reads a dozen fields of each entry. This reader runs the
// pickle's opcodes on a stack of small tagged values (strings stay in the caller's buffer,
// containers are item vectors shared by reference as the memo shares them), then reads those
// fields into columns. Nothing is imported or called: GLOBAL and STACK_GLOBAL are refused as
// c4d/formats/flight_recorder.py's restricted unpickler refuses them.
//
// Untrusted input (docs/untrusted-input.md, "Imports"): what it builds is counted at what Python
// would have built (so the limit of bytes built per byte of pickle means what it means for the
// Python reader), the references its read of the entries walks are counted against the walk
// limit, the clock is checked against the import's deadline. Whatever it does not handle the
// way the Python reader would (another opcode, an unusual field type, a huge integer) is
// answered FRR_FALLBACK, and the caller reads the file the Python way.
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {

enum Status : int32_t {
  FRR_OK = 0,
  FRR_FALLBACK = 1,      // msg: what it does not handle
  FRR_BUILT = 2,         // a: bytes built, b: bytes read, c: the limit
  FRR_EXPAND = 3,        // c: the walk limit
  FRR_TOO_MANY = 4,      // n: entries
  FRR_TIME = 5,          // past the deadline
  FRR_ERROR = 6,         // msg: one line (truncated, malformed, a global, a persistent id)
  FRR_NOT_A_DUMP = 7,    // msg: one line (no top-level dict with 'version', entries not a list)
};

enum Tag : uint32_t { NONE, BOOL, INT, BIGINT, FLOAT, STR, BYTES, LIST, TUPLE, DICT, SET, FROZENSET, UNSET };

struct Val {
  uint32_t t;
  uint32_t len;  // STR/BYTES: length
  union {
    int64_t i;   // BOOL, INT; container index for LIST..FROZENSET
    double f;
    uint64_t off;  // STR/BYTES: offset in the pickle
  };
};
static_assert(sizeof(Val) == 16, "Val is 16 bytes");

// What Python builds for each kind of object (sys.getsizeof, plus a container's share of slots):
// the Python reader's limit on bytes built per byte of pickle is checked against these.
constexpr int64_t COST_INT = 32, COST_FLOAT = 24, COST_STR = 56, COST_BYTES = 40;
constexpr int64_t COST_LIST = 56, COST_DICT = 64, COST_TUPLE = 40, COST_SET = 216;
constexpr int64_t COST_SLOT = 8, COST_DICT_ITEM = 40, COST_SET_ITEM = 32, COST_MEMO = 8;

// A container's items: runs ("chunks") of one pool, linked; most containers have one run.
constexpr uint32_t NIL = 0xFFFFFFFFu;
struct Chunk {
  uint32_t start, n, next;
};
struct Cont {
  uint32_t head, tail;
};
struct Span {
  const Val* p = nullptr;
  size_t n = 0;
  const Val* begin() const { return p; }
  const Val* end() const { return p + n; }
  size_t size() const { return n; }
  bool empty() const { return n == 0; }
  const Val& operator[](size_t k) const { return p[k]; }
};

// Buffers kept from one dump to the next on a thread (released past KEEP_BYTES)
struct Arena {
  std::vector<Val> stack, memo, pool;
  std::vector<size_t> marks;
  std::vector<Chunk> chunks;
  std::vector<Cont> conts;
  void clear() {
    constexpr size_t KEEP_BYTES = size_t(64) << 20;
    size_t held = (stack.capacity() + memo.capacity() + pool.capacity()) * sizeof(Val) +
                  chunks.capacity() * sizeof(Chunk) + conts.capacity() * sizeof(Cont);
    if (held > KEEP_BYTES) {
      *this = Arena();
      return;
    }
    stack.clear();
    memo.clear();
    pool.clear();
    marks.clear();
    chunks.clear();
    conts.clear();
  }
};

struct Bail {
  Status st;
  std::string msg;
};

}  // namespace

extern "C" {

struct frr_limits {
  int64_t built_per_byte;  // bytes built allowed per byte of pickle read ...
  int64_t free_bytes;      // ... past this much
  int64_t budget_left;     // and never past what is left of the import's budget
  int64_t walk_limit;      // references the read of the entries may walk
  int64_t max_entries;     // entries past which the dump does not fit the budget
  int64_t check_every;     // bytes of pickle between two checks of the clock and the bytes built
  double deadline;         // CLOCK_MONOTONIC seconds (Python's time.monotonic)
  const char* use_output;  // op names (newline-separated) whose element count is output_sizes'
};

struct frr_info {
  int32_t status;
  int32_t nstr;       // strings in the table
  int64_t n;          // entries
  int64_t a, b, c;    // status details
  int64_t blob_len;   // bytes of the string table
  int32_t counts[8];  // strings per table: pg names, pg descs, names, states, dtypes, top (2), pg_config (pairs x 2)
  int64_t first_record;
  char msg[512];
};

struct frr_cols {
  int32_t* pg;
  int32_t* name;
  int32_t* state;
  int32_t* dtype;
  int64_t* cseq;
  int64_t* pseq;
  uint8_t* retired;
  int64_t* t_created;
  int64_t* t_started;
  int64_t* t_completed;
  double* duration_ms;
  int64_t* numel;
};

}  // extern "C"

namespace {

enum Field : int {
  F_CSEQ,
  F_PSEQ,
  F_CREATED,
  F_STARTED,
  F_COMPLETED,
  F_RETIRED,
  F_STATE,
  F_NAME,
  F_PG,
  F_IN_SIZES,
  F_IN_DTYPES,
  F_OUT_SIZES,
  F_DURATION,
  F_RECORD_ID,
  F_N
};
const char* const FIELD_KEYS[F_N] = {
    "collective_seq_id", "p2p_seq_id",   "time_created_ns", "time_discovered_started_ns",
    "time_discovered_completed_ns", "retired", "state", "profiling_name", "process_group",
    "input_sizes", "input_dtypes", "output_sizes", "duration_ms", "record_id"};

double now_monotonic() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// A factorized string column: codes in order of first appearance, as c4d's _factorize gives.
struct Factor {
  std::unordered_map<std::string_view, int32_t> code;
  std::vector<std::string_view> uniq;
  int32_t last_code = -1;
  const char* last_ptr = nullptr;
  size_t last_len = 0;
  int32_t get(std::string_view s) {
    if (last_code >= 0 && s.data() == last_ptr && s.size() == last_len) return last_code;  // a shared string
    auto it = code.find(s);
    int32_t c;
    if (it == code.end()) {
      c = int32_t(uniq.size());
      code.emplace(s, c);
      uniq.push_back(s);
    } else {
      c = it->second;
    }
    last_ptr = s.data();
    last_len = s.size();
    last_code = c;
    return c;
  }
};

struct Reader {
  const uint8_t* d;
  size_t len;
  // where the next opcode is: a pointer, which the stores of values never alias (a size_t would be
  // reloaded after each one)
  const uint8_t* cur;
  const uint8_t* end;
  const uint8_t* next_check;
  size_t pos() const { return size_t(cur - d); }
  const frr_limits& lim;
  Arena& ar;  // its buffers are taken for the read (members, not references: no indirection) and given back
  std::vector<Val> stack;
  std::vector<size_t> marks;
  std::vector<Val> memo;
  uint64_t memo_len = 0;  // values stored (MEMOIZE stores at this index, as Python's unpickler does)
  std::vector<Cont> conts;
  std::vector<Chunk> chunks;
  std::vector<Val> pool;
  int64_t built = 0;
  int64_t walked = 0;

  Reader(const uint8_t* data, size_t n, const frr_limits& l, Arena& a)
      : d(data), len(n), lim(l), ar(a) {
    a.clear();
    stack.swap(a.stack);
    marks.swap(a.marks);
    memo.swap(a.memo);
    conts.swap(a.conts);
    chunks.swap(a.chunks);
    pool.swap(a.pool);
    cur = d;
    end = d + len;
    size_t step = size_t(l.check_every > 0 ? l.check_every : 1 << 18);
    next_check = len > step ? d + step : end;
  }

  ~Reader() {
    stack.swap(ar.stack);
    marks.swap(ar.marks);
    memo.swap(ar.memo);
    conts.swap(ar.conts);
    chunks.swap(ar.chunks);
    pool.swap(ar.pool);
  }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  [[noreturn]] void fail(Status st, std::string msg) { throw Bail{st, std::move(msg)}; }
  [[noreturn]] void truncated() { fail(FRR_ERROR, "the pickle is cut short (truncated file)"); }
  [[noreturn]] void malformed(const std::string& why) {
    fail(FRR_ERROR, "not a readable Flight Recorder dump (malformed pickle: " + why + ")");
  }
  [[noreturn]] void fallback(const std::string& why) { fail(FRR_FALLBACK, why); }

  int64_t built_limit() const {
    int64_t by_bytes = lim.built_per_byte * int64_t(pos()) + lim.free_bytes;
    return by_bytes < lim.budget_left ? by_bytes : lim.budget_left;
  }
  void check_built() {
    if (built > built_limit()) {
      Bail b{FRR_BUILT, ""};
      throw b;
    }
  }
  void periodic() {
    size_t step = size_t(lim.check_every > 0 ? lim.check_every : 1 << 18);
    next_check = size_t(end - cur) > step ? cur + step : end;
    check_built();
    if (lim.deadline > 0 && now_monotonic() > lim.deadline) fail(FRR_TIME, "");
  }

  const uint8_t* take(size_t n) {
    if (n > size_t(end - cur)) truncated();
    const uint8_t* p = cur;
    cur += n;
    return p;
  }
  uint64_t le(size_t n) {  // a little-endian unsigned of n <= 8 bytes
    const uint8_t* p = take(n);
    uint64_t v = 0;
    if (n == 1) return p[0];
    if (n == 2) return uint64_t(p[0]) | uint64_t(p[1]) << 8;
    if (n == 4) return uint64_t(p[0]) | uint64_t(p[1]) << 8 | uint64_t(p[2]) << 16 | uint64_t(p[3]) << 24;
    for (size_t k = 0; k < n; ++k) v |= uint64_t(p[k]) << (8 * k);
    return v;
  }

  size_t fence() const { return marks.empty() ? 0 : marks.back(); }
  Val pop() {
    if (stack.size() <= fence()) malformed("stack underflow");
    Val v = stack.back();
    stack.pop_back();
    return v;
  }
  Val& top() {
    if (stack.size() <= fence()) malformed("stack underflow");
    return stack.back();
  }
  size_t pop_mark() {
    if (marks.empty()) malformed("could not find MARK");
    size_t m = marks.back();
    marks.pop_back();
    return m;
  }

  Val container(Tag t, int64_t cost) {
    Val v;
    v.t = t;
    v.len = 0;
    v.i = int64_t(conts.size());
    if (conts.size() >= NIL) fallback("over 4 G containers");
    conts.push_back(Cont{NIL, NIL});
    built += cost;
    return v;
  }
  // append n items to container ci: the run it ends with grows where it ends the pool
  void add(int64_t ci, const Val* p, size_t n) {
    if (n == 0) return;
    if (pool.size() + n >= NIL) fallback("over 4 G items");
    Cont& c = conts[size_t(ci)];
    if (c.tail != NIL && chunks[c.tail].start + chunks[c.tail].n == pool.size()) {
      chunks[c.tail].n += uint32_t(n);
    } else {
      uint32_t k = uint32_t(chunks.size());
      chunks.push_back(Chunk{uint32_t(pool.size()), uint32_t(n), NIL});
      if (c.tail == NIL)
        c.head = k;
      else
        chunks[c.tail].next = k;
      c.tail = k;
    }
    pool.insert(pool.end(), p, p + n);
  }
  // every container in one run (after the pickle is read, before its items are)
  void settle() {
    std::vector<Val> tmp;
    for (Cont& c : conts) {
      if (c.head == c.tail) continue;
      tmp.clear();
      for (uint32_t k = c.head; k != NIL; k = chunks[k].next)
        tmp.insert(tmp.end(), pool.begin() + chunks[k].start, pool.begin() + chunks[k].start + chunks[k].n);
      uint32_t k = uint32_t(chunks.size());
      chunks.push_back(Chunk{uint32_t(pool.size()), uint32_t(tmp.size()), NIL});
      pool.insert(pool.end(), tmp.begin(), tmp.end());
      c.head = c.tail = k;
    }
  }
  void push_int(int64_t x) {
    Val v;
    v.t = INT;
    v.len = 0;
    v.i = x;
    stack.push_back(v);
    built += COST_INT;
  }
  // UTF-8 as Python's unpickler decodes a str ('surrogatepass': encoded surrogates are let through)
  static bool utf8(const uint8_t* p, size_t n) {
    size_t k = 0;
    while (k < n) {
      if (k + 8 <= n) {
        uint64_t w;
        memcpy(&w, p + k, 8);
        if (!(w & 0x8080808080808080ull)) {
          k += 8;
          continue;
        }
      }
      uint8_t c = p[k];
      if (c < 0x80) {
        k++;
        continue;
      }
      size_t more;
      uint8_t lo = 0x80, hi = 0xBF;
      if (c >= 0xC2 && c <= 0xDF) {
        more = 1;
      } else if (c >= 0xE0 && c <= 0xEF) {
        more = 2;
        if (c == 0xE0) lo = 0xA0;
      } else if (c >= 0xF0 && c <= 0xF4) {
        more = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
      } else {
        return false;
      }
      if (k + more >= n) return false;
      if (p[k + 1] < lo || p[k + 1] > hi) return false;
      for (size_t j = 2; j <= more; ++j)
        if (p[k + j] < 0x80 || p[k + j] > 0xBF) return false;
      k += more + 1;
    }
    return true;
  }
  void push_str(Tag t, size_t n) {
    if (n > 0xFFFFFFFFull) fallback("a string over 4 GiB");
    const uint8_t* p = take(n);
    if (t == STR && !utf8(p, n)) malformed("a str that is not UTF-8");
    Val v;
    v.t = t;
    v.len = uint32_t(n);
    v.off = uint64_t(p - d);
    stack.push_back(v);
    built += (t == STR ? COST_STR : COST_BYTES) + int64_t(n);
  }
  // a dict key or set item Python hashes without walking it (a tuple could hold a list)
  static bool hashable(const Val& v) { return v.t != LIST && v.t != DICT && v.t != SET && v.t != TUPLE; }

  void memo_put(uint64_t idx) {
    const Val& v = top();
    if (idx >= memo.size()) {
      uint64_t want = idx + 1;
      if (want < memo.size() * 2) want = memo.size() * 2;
      built += int64_t((want - memo.size()) * COST_MEMO);
      check_built();  // a huge index is refused before it is allocated
      Val unset{};
      unset.t = UNSET;
      memo.resize(want, unset);
    }
    if (memo[idx].t == UNSET) memo_len++;
    memo[idx] = v;
  }
  void memo_get(uint64_t idx) {
    if (idx >= memo.size() || memo[idx].t == UNSET) malformed("memo value not found at index " + std::to_string(idx));
    stack.push_back(memo[idx]);
  }

  // items from the last mark to the top, appended to the container under the mark
  void extend_from_mark(uint8_t op) {
    bool pairs = op == 'u';
    size_t m = pop_mark();
    if (m == 0 || m > stack.size()) malformed("stack underflow");
    Val& target = stack[m - 1];
    if (m - 1 < fence()) malformed("stack underflow");
    size_t n = stack.size() - m;
    if (pairs) {
      if (n % 2) malformed("odd number of items for SETITEMS");
      if (target.t != DICT) fallback("SETITEMS on something not a dict");
      for (size_t k = m; k < stack.size(); k += 2)
        if (!hashable(stack[k])) fallback("an unhashable dict key");
      built += int64_t(n / 2) * COST_DICT_ITEM;
    } else if (op == 'e' && target.t == LIST) {
      built += int64_t(n) * COST_SLOT;
    } else if (op == 0x90 && target.t == SET) {
      for (size_t k = m; k < stack.size(); ++k)
        if (!hashable(stack[k])) fallback("an unhashable set item");
      built += int64_t(n) * COST_SET_ITEM;
    } else {
      fallback("APPENDS or ADDITEMS on another kind of container");
    }
    add(target.i, stack.data() + m, n);
    stack.resize(m);
  }

  Val from_mark(Tag t) {
    size_t m = pop_mark();
    if (m > stack.size()) malformed("stack underflow");
    size_t n = stack.size() - m;
    int64_t cost = t == TUPLE ? COST_TUPLE + int64_t(n) * COST_SLOT
                   : t == LIST ? COST_LIST + int64_t(n) * COST_SLOT
                   : t == DICT ? COST_DICT + int64_t(n / 2) * COST_DICT_ITEM
                               : COST_SET + int64_t(n) * COST_SET_ITEM;
    if (t == DICT && n % 2) malformed("odd number of items for DICT");
    if (t == DICT || t == FROZENSET)
      for (size_t k = m; k < stack.size(); k += (t == DICT ? 2 : 1))
        if (!hashable(stack[k])) fallback("an unhashable key");
    Val v = container(t, cost);
    add(v.i, stack.data() + m, n);
    stack.resize(m);
    return v;
  }

  std::string_view sv(const Val& v) const { return std::string_view(reinterpret_cast<const char*>(d + v.off), v.len); }

  void refuse_global(std::string_view module, std::string_view name) {
    if (module == "collections" && name == "OrderedDict") fallback("an OrderedDict");
    std::string m(module), n(name);
    fail(FRR_ERROR, "refers to the Python global " + m + "." + n +
                        "; a Flight Recorder dump holds only plain data, so it was not loaded (and nothing in it "
                        "was run)");
  }

  std::string_view line() {
    const void* nl = memchr(cur, '\n', size_t(end - cur));
    if (!nl) truncated();
    size_t n = size_t(static_cast<const uint8_t*>(nl) - cur);
    std::string_view s(reinterpret_cast<const char*>(cur), n);
    cur += n + 1;
    return s;
  }

  Val run() {
    if (len < 2 || d[0] != 0x80) fallback("not protocol 2 or later");
    for (;;) {
      if (cur >= next_check) {
        if (cur >= end) truncated();
        periodic();
      }
      uint8_t op = *cur++;
      switch (op) {
        case 0x80:  // PROTO
          if (le(1) > 5) fallback("a pickle protocol past 5");
          break;
        case 0x95: {  // FRAME: its bytes follow in line, and must be there (as Python's unpickler checks)
          uint64_t n = le(8);
          if (n > uint64_t(end - cur)) truncated();
          break;
        }
        case '.': {  // STOP
          if (stack.empty() || stack.size() <= fence()) malformed("stack underflow at STOP");
          periodic();
          return stack.back();
        }
        case '(':  // MARK
          marks.push_back(stack.size());
          break;
        case '0': {  // POP
          if (stack.size() > fence())
            stack.pop_back();
          else if (!marks.empty())
            marks.pop_back();
          else
            malformed("stack underflow");
          break;
        }
        case '1':  // POP_MARK
          stack.resize(pop_mark());
          break;
        case '2': {  // DUP
          Val v = top();
          stack.push_back(v);
          break;
        }
        case 'N': {
          Val v{};
          v.t = NONE;
          stack.push_back(v);
          break;
        }
        case 0x88:    // NEWTRUE
        case 0x89: {  // NEWFALSE
          Val v{};
          v.t = BOOL;
          v.i = op == 0x88;
          stack.push_back(v);
          break;
        }
        case 'J':
          push_int(int32_t(uint32_t(le(4))));
          break;
        case 'K':
          push_int(int64_t(le(1)));
          break;
        case 'M':
          push_int(int64_t(le(2)));
          break;
        case 0x8a: {  // LONG1
          size_t n = size_t(le(1));
          if (n > 8) {
            take(n);
            Val v{};
            v.t = BIGINT;
            stack.push_back(v);
            built += COST_INT + int64_t(n);
            break;
          }
          uint64_t x = le(n);
          if (n > 0 && n < 8 && (x >> (8 * n - 1)) & 1) x |= ~uint64_t(0) << (8 * n);  // sign-extend
          push_int(int64_t(x));
          break;
        }
        case 0x8b: {  // LONG4
          uint64_t n = le(4);
          int32_t sn = int32_t(uint32_t(n));
          if (sn < 0) malformed("LONG pickle has negative byte count");
          take(size_t(sn));
          Val v{};
          v.t = BIGINT;
          stack.push_back(v);
          built += COST_INT + sn;
          break;
        }
        case 'G': {  // BINFLOAT, big-endian
          const uint8_t* p = take(8);
          uint64_t b = 0;
          for (int k = 0; k < 8; ++k) b = (b << 8) | p[k];
          Val v{};
          v.t = FLOAT;
          memcpy(&v.f, &b, 8);
          stack.push_back(v);
          built += COST_FLOAT;
          break;
        }
        case 'X':  // BINUNICODE
          push_str(STR, size_t(le(4)));
          break;
        case 0x8c:  // SHORT_BINUNICODE
          push_str(STR, size_t(le(1)));
          break;
        case 0x8d:  // BINUNICODE8
          push_str(STR, size_t(le(8)));
          break;
        case 'B':  // BINBYTES
          push_str(BYTES, size_t(le(4)));
          break;
        case 'C':  // SHORT_BINBYTES
          push_str(BYTES, size_t(le(1)));
          break;
        case 0x8e:  // BINBYTES8
          push_str(BYTES, size_t(le(8)));
          break;
        case '}':
          stack.push_back(container(DICT, COST_DICT));
          break;
        case ']':
          stack.push_back(container(LIST, COST_LIST));
          break;
        case ')':
          stack.push_back(container(TUPLE, COST_TUPLE));
          break;
        case 0x8f:  // EMPTY_SET
          stack.push_back(container(SET, COST_SET));
          break;
        case 't':
          stack.push_back(from_mark(TUPLE));
          break;
        case 'l':
          stack.push_back(from_mark(LIST));
          break;
        case 'd':
          stack.push_back(from_mark(DICT));
          break;
        case 0x91:  // FROZENSET
          stack.push_back(from_mark(FROZENSET));
          break;
        case 0x85:  // TUPLE1
        case 0x86:  // TUPLE2
        case 0x87: {  // TUPLE3
          size_t n = size_t(op - 0x84);
          if (stack.size() < fence() + n) malformed("stack underflow");
          Val v = container(TUPLE, COST_TUPLE + int64_t(n) * COST_SLOT);
          add(v.i, stack.data() + stack.size() - n, n);
          stack.resize(stack.size() - n);
          stack.push_back(v);
          break;
        }
        case 'a': {  // APPEND
          Val x = pop();
          Val& l = top();
          if (l.t != LIST) fallback("APPEND to something not a list");
          add(l.i, &x, 1);
          built += COST_SLOT;
          break;
        }
        case 'e':  // APPENDS
        case 0x90:  // ADDITEMS
          extend_from_mark(op);
          break;
        case 's': {  // SETITEM
          Val v = pop();
          Val k = pop();
          Val& t = top();
          if (t.t != DICT) fallback("SETITEM on something not a dict");
          if (!hashable(k)) fallback("an unhashable dict key");
          Val kv[2] = {k, v};
          add(t.i, kv, 2);
          built += COST_DICT_ITEM;
          break;
        }
        case 'u':
          extend_from_mark(op);
          break;
        case 'q':
          memo_put(le(1));
          break;
        case 'r':
          memo_put(le(4));
          break;
        case 0x94:  // MEMOIZE
          memo_put(memo_len);
          break;
        case 'h':
          memo_get(le(1));
          break;
        case 'j':
          memo_get(le(4));
          break;
        case 'c': {  // GLOBAL
          std::string_view m = line();
          std::string_view n = line();
          refuse_global(m, n);
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          Val n = pop();
          Val m = pop();
          if (m.t != STR || n.t != STR) malformed("STACK_GLOBAL requires str");
          refuse_global(sv(m), sv(n));
          break;
        }
        case 'P':
        case 'Q':
          fail(FRR_ERROR, "uses a persistent id; a Flight Recorder dump never does");
        default:
          // protocol 0/1 text opcodes, objects built by calls (REDUCE, BUILD, NEWOBJ, ...), buffers,
          // extensions: not what a dump holds; the Python reader decides
          {
            char buf[64];
            snprintf(buf, sizeof buf, "opcode 0x%02x", op);
            fallback(buf);
          }
      }
    }
  }
  // ------------------------------------------------------------------ reading the fields
  Span items(const Val& v) const {
    const Cont& c = conts[size_t(v.i)];
    if (c.head == NIL) return Span{};
    return Span{pool.data() + chunks[c.head].start, chunks[c.head].n};
  }
  void walk(int64_t n) {
    walked += n;
    if (walked > lim.walk_limit) {
      Bail b{FRR_EXPAND, ""};
      throw b;
    }
  }
  static bool seq(const Val& v) { return v.t == LIST || v.t == TUPLE; }
  // a dict's value for a str key (the last one set, as a dict keeps)
  const Val* get(const Val& dict, std::string_view key) {
    const auto& it = items(dict);
    walk(int64_t(it.size() / 2));
    const Val* out = nullptr;
    for (size_t k = 0; k + 1 < it.size(); k += 2)
      if (it[k].t == STR && sv(it[k]) == key) out = &it[k + 1];
    return out;
  }
  // sum over tensors of the product of their dimensions; false where the Python reader would decide
  bool numel(const Val* sizes, int64_t& out) {
    out = 0;
    if (!sizes || sizes->t == NONE) return true;
    if (!seq(*sizes)) return false;
    const auto& ts = items(*sizes);
    walk(int64_t(ts.size()));
    for (const Val& t : ts) {
      if (!seq(t)) return false;
      const auto& dims = items(t);
      walk(int64_t(dims.size()));
      int64_t p = 1;
      for (const Val& x : dims) {
        if (x.t != INT && x.t != BOOL) return false;
        if (__builtin_mul_overflow(p, x.i, &p)) return false;
      }
      if (__builtin_add_overflow(out, p, &out)) return false;
    }
    return true;
  }
};

bool int_like(const Val* v, int64_t& out) {
  if (!v || v->t == NONE) {
    out = 0;
    return true;
  }
  if (v->t == INT || v->t == BOOL) {
    out = v->i;
    return true;
  }
  return false;
}

// _text: str(x) of an atom, "" of anything else; false where str() of it is not reproduced here
bool text(const Reader& r, const Val& v, std::string& out) {
  switch (v.t) {
    case STR:
      out.assign(r.sv(v));
      return true;
    case NONE:
      out = "None";
      return true;
    case BOOL:
      out = v.i ? "True" : "False";
      return true;
    case INT:
      out = std::to_string(v.i);
      return true;
    case FLOAT:
    case BIGINT:
      return false;
    default:
      out.clear();
      return true;
  }
}

bool truthy(const Reader& r, const Val& v) {
  switch (v.t) {
    case NONE:
      return false;
    case BOOL:
    case INT:
      return v.i != 0;
    case FLOAT:
      return v.f != 0;
    case STR:
    case BYTES:
      return v.len != 0;
    case BIGINT:
      return true;
    default:
      return !r.items(v).empty();
  }
}

struct Result {
  std::vector<int32_t> pg, name, state, dtype;
  std::vector<int64_t> cseq, pseq, t_created, t_started, t_completed, numel;
  std::vector<uint8_t> retired;
  std::vector<double> duration;
  std::string blob;
  std::vector<int64_t> offs{0};
  int32_t counts[8] = {0};
  int64_t first_record = 0;
  int32_t nstr = 0;
  void add(int table, std::string_view s) {
    blob.append(s.data(), s.size());
    offs.push_back(int64_t(blob.size()));
    counts[table]++;
    nstr++;
  }
};

// the op token of a profiling name, as c4d's parse_name takes it
std::string_view op_token(std::string_view name) {
  size_t c = name.find(':');
  std::string_view rest = c == std::string_view::npos ? std::string_view() : name.substr(c + 1);
  if (rest.empty()) rest = name;
  size_t sp = rest.find(' ');
  return sp == std::string_view::npos ? rest : rest.substr(0, sp);
}

void read_dump(Reader& r, const Val& topv, Result& res, frr_info& info) {
  if (topv.t != DICT) throw Bail{FRR_NOT_A_DUMP, "no top-level dict with a 'version' key"};
  const Val* version = r.get(topv, "version");
  if (!version) throw Bail{FRR_NOT_A_DUMP, "no top-level dict with a 'version' key"};
  const Val* lib = r.get(topv, "comm_lib_version");
  const Val* cfg = r.get(topv, "pg_config");
  const Val* ents = r.get(topv, "entries");
  if (ents && ents->t != LIST) r.fallback("entries is not a list");
  const Span E = ents ? r.items(*ents) : Span{};
  int64_t n = int64_t(E.size());
  info.n = n;
  if (n > r.lim.max_entries) throw Bail{FRR_TOO_MANY, ""};
  r.walk(n);

  std::unordered_set<std::string_view> use_out;
  std::string_view uo(r.lim.use_output ? r.lim.use_output : "");
  while (!uo.empty()) {
    size_t nl = uo.find('\n');
    use_out.insert(uo.substr(0, nl));
    if (nl == std::string_view::npos) break;
    uo.remove_prefix(nl + 1);
  }

  res.pg.resize(size_t(n));
  res.name.resize(size_t(n));
  res.state.resize(size_t(n));
  res.dtype.resize(size_t(n));
  res.cseq.resize(size_t(n));
  res.pseq.resize(size_t(n));
  res.t_created.resize(size_t(n));
  res.t_started.resize(size_t(n));
  res.t_completed.resize(size_t(n));
  res.numel.resize(size_t(n));
  res.retired.resize(size_t(n));
  res.duration.resize(size_t(n));
  Factor pgs, names, states, dtypes;
  std::vector<std::string> descs;  // per pg code, from its first entry
  std::vector<bool> out_of;  // per profiling name code: its element count is output_sizes'

  int8_t by_len[32][2];  // the fields whose key has this length (two at most)
  memset(by_len, -1, sizeof by_len);
  for (int q = 0; q < F_N; ++q) {
    size_t l = strlen(FIELD_KEYS[q]);
    by_len[l][by_len[l][0] < 0 ? 0 : 1] = int8_t(q);
  }

  // keys are memoized strings: the field of a key's offset in the pickle, looked up once
  struct KeyCache {
    uint64_t off = ~uint64_t(0);
    int8_t field = -1;
  } kc[256];
  for (int64_t e = 0; e < n; ++e) {
    if ((e & 1023) == 1023 && r.lim.deadline > 0 && now_monotonic() > r.lim.deadline) throw Bail{FRR_TIME, ""};
    const Val& ent = E[size_t(e)];
    if (ent.t != DICT) r.fallback("an entry that is not a dict");
    const Val* f[F_N] = {nullptr};
    const auto& it = r.items(ent);
    r.walk(int64_t(it.size() / 2));
    for (size_t k = 0; k + 1 < it.size(); k += 2) {
      if (it[k].t != STR) continue;
      size_t l = it[k].len;
      if (l >= 32) continue;
      KeyCache& slot = kc[(it[k].off * 0x9E3779B97F4A7C15ull) >> 56];
      if (slot.off != it[k].off) {
        const char* key = reinterpret_cast<const char*>(r.d + it[k].off);
        slot.off = it[k].off;
        slot.field = -1;
        for (int8_t q : by_len[l])
          if (q >= 0 && memcmp(key, FIELD_KEYS[q], l) == 0) {
            slot.field = q;
            break;
          }
      }
      if (slot.field >= 0) f[slot.field] = &it[k + 1];
    }
    for (int q : {F_CSEQ, F_PSEQ, F_CREATED, F_STATE, F_NAME, F_PG})
      if (!f[q]) r.fallback(std::string("an entry without ") + FIELD_KEYS[q]);
    size_t i = size_t(e);
    if (!int_like(f[F_CSEQ], res.cseq[i]) || !int_like(f[F_PSEQ], res.pseq[i]) ||
        !int_like(f[F_CREATED], res.t_created[i]) || !int_like(f[F_STARTED], res.t_started[i]) ||
        !int_like(f[F_COMPLETED], res.t_completed[i]))
      r.fallback("an integer field that is not an int or None");
    const Val* rt = f[F_RETIRED];
    if (!rt || rt->t == NONE)
      res.retired[i] = 0;
    else if (rt->t == BOOL || rt->t == INT)
      res.retired[i] = rt->i != 0;
    else
      r.fallback("retired is not a bool");
    if (f[F_STATE]->t != STR || f[F_NAME]->t != STR) r.fallback("state or profiling_name not a str");
    res.state[i] = states.get(r.sv(*f[F_STATE]));
    std::string_view pname = r.sv(*f[F_NAME]);
    res.name[i] = names.get(pname);
    const Val* pg = f[F_PG];
    if (!Reader::seq(*pg)) r.fallback("process_group not a tuple");
    const auto& pgi = r.items(*pg);
    r.walk(int64_t(pgi.size()));
    if (pgi.empty() || pgi[0].t != STR) r.fallback("process_group's name not a str");
    size_t before = pgs.uniq.size();
    res.pg[i] = pgs.get(r.sv(pgi[0]));
    if (pgs.uniq.size() > before) {
      std::string desc;
      if (pgi.size() > 1 && !text(r, pgi[1], desc)) r.fallback("process_group's desc a float");
      descs.push_back(std::move(desc));
    }
    // dtype: the first input dtype
    const Val* dt = f[F_IN_DTYPES];
    std::string_view dts;
    if (dt && Reader::seq(*dt)) {
      const auto& di = r.items(*dt);
      r.walk(1);
      if (!di.empty()) {
        if (di[0].t != STR) r.fallback("input_dtypes not str");
        dts = r.sv(di[0]);
      }
    } else if (dt && dt->t != NONE) {
      r.fallback("input_dtypes not a list");
    }
    res.dtype[i] = dtypes.get(dts);
    // duration
    const Val* du = f[F_DURATION];
    double dur = NAN;
    if (du && du->t == FLOAT)
      dur = std::isfinite(du->f) ? du->f : NAN;
    else if (du && du->t == INT)
      dur = double(du->i);
    else if (du && du->t != NONE)
      r.fallback("duration_ms not a number");
    res.duration[i] = dur;
    // element count: output_sizes for the ops whose size is their output's
    size_t nc = size_t(res.name[i]);
    if (nc == out_of.size()) out_of.push_back(use_out.count(op_token(pname)) > 0);  // a name first seen
    bool out = out_of[nc];
    if (!r.numel(f[F_IN_SIZES], res.numel[i])) r.fallback("sizes that are not lists of ints");
    if (out && !r.numel(f[F_OUT_SIZES], res.numel[i])) r.fallback("sizes that are not lists of ints");
    if (e == 0) {
      const Val* rid = f[F_RECORD_ID];
      if (rid && rid->t != NONE && rid->t != INT && rid->t != BOOL) r.fallback("record_id not an int");
      res.first_record = rid && (rid->t == INT || rid->t == BOOL) ? rid->i : 0;
    }
  }
  for (auto s : pgs.uniq) res.add(0, s);
  for (auto& s : descs) res.add(1, s);
  for (auto s : names.uniq) res.add(2, s);
  for (auto s : states.uniq) res.add(3, s);
  for (auto s : dtypes.uniq) res.add(4, s);
  std::string t;
  if (!text(r, *version, t)) r.fallback("version a float");
  res.add(5, t);
  t.clear();
  if (lib && truthy(r, *lib) && !text(r, *lib, t)) r.fallback("comm_lib_version a float");
  res.add(5, t);
  // pg_config: (name, ranks text) of each group whose ranks are a str
  if (cfg && cfg->t == DICT) {
    const auto& ci = r.items(*cfg);
    r.walk(int64_t(ci.size() / 2));
    std::unordered_set<std::string_view> keys;
    for (size_t k = 0; k + 1 < ci.size(); k += 2) {
      if (ci[k].t != STR) r.fallback("a pg_config key not a str");
      if (!keys.insert(r.sv(ci[k])).second) r.fallback("a pg_config key twice");
      const Val& v = ci[k + 1];
      if (v.t != DICT) continue;
      const Val* ranks = r.get(v, "ranks");
      if (!ranks || (ranks->t != STR && !Reader::seq(*ranks))) continue;
      if (ranks->t != STR) r.fallback("pg_config ranks as a list");
      const Val* nm = r.get(v, "name");
      if (nm && nm->t != STR) r.fallback("a pg_config name not a str");
      res.add(6, r.sv(nm ? *nm : ci[k]));
      res.add(6, r.sv(*ranks));
    }
  } else if (cfg && cfg->t != NONE) {
    r.fallback("pg_config not a dict");
  }
}

struct Handle {
  Result res;
};

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int frr_version(void) { return 1; }

// Read one dump. Returns a handle to pass to frr_fill (status FRR_OK) or null; info says why.
__attribute__((visibility("default"))) void* frr_read(const uint8_t* data, size_t len, const frr_limits* lim,
                                                      frr_info* info) {
  memset(info, 0, sizeof *info);
  Handle* h = nullptr;
  try {
    static thread_local Arena arena;
    Reader r(data, len, *lim, arena);
    try {
      Val topv = r.run();
      r.settle();
      h = new Handle();
      read_dump(r, topv, h->res, *info);
    } catch (Bail& b) {
      delete h;
      h = nullptr;
      info->status = b.st;
      info->a = r.built;
      info->b = int64_t(r.pos());
      info->c = b.st == FRR_EXPAND ? lim->walk_limit : r.built_limit();
      snprintf(info->msg, sizeof info->msg, "%s", b.msg.c_str());
      return nullptr;
    }
    info->status = FRR_OK;
    info->nstr = h->res.nstr;
    info->blob_len = int64_t(h->res.blob.size());
    memcpy(info->counts, h->res.counts, sizeof info->counts);
    info->first_record = h->res.first_record;
    return h;
  } catch (std::bad_alloc&) {
    delete h;
    info->status = FRR_FALLBACK;
    snprintf(info->msg, sizeof info->msg, "out of memory");
    return nullptr;
  }
}

__attribute__((visibility("default"))) void frr_fill(void* handle, const frr_cols* c, char* blob, int64_t* offs) {
  const Result& r = static_cast<Handle*>(handle)->res;
  size_t n = r.pg.size();
  memcpy(offs, r.offs.data(), r.offs.size() * 8);
  if (!r.blob.empty()) memcpy(blob, r.blob.data(), r.blob.size());
  if (n == 0) return;
  memcpy(c->pg, r.pg.data(), n * 4);
  memcpy(c->name, r.name.data(), n * 4);
  memcpy(c->state, r.state.data(), n * 4);
  memcpy(c->dtype, r.dtype.data(), n * 4);
  memcpy(c->cseq, r.cseq.data(), n * 8);
  memcpy(c->pseq, r.pseq.data(), n * 8);
  memcpy(c->retired, r.retired.data(), n);
  memcpy(c->t_created, r.t_created.data(), n * 8);
  memcpy(c->t_started, r.t_started.data(), n * 8);
  memcpy(c->t_completed, r.t_completed.data(), n * 8);
  memcpy(c->duration_ms, r.duration.data(), n * 8);
  memcpy(c->numel, r.numel.data(), n * 8);
}

__attribute__((visibility("default"))) void frr_free(void* handle) { delete static_cast<Handle*>(handle); }

}  // extern "C"
