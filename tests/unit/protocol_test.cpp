// The wire protocol (protocol/offload/protocol.h): encode / check_header / read_payload round
// trips for every message, every class of bad header, FrameReader on split and batched
// streams, read_status on inconsistent counts.
#include "offload/protocol.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace offload::proto {
namespace {

// Bytes of a payload that are all different from zero, strings NUL-terminated.
template <class T>
T sample(unsigned char seed) {
  T v;
  auto* p = reinterpret_cast<unsigned char*>(&v);
  for (size_t i = 0; i < sizeof v; ++i) p[i] = static_cast<unsigned char>(seed + i * 7 + 1) | 1;
  terminate_strings(v);
  return v;
}

FrameHeader header_of(const std::vector<unsigned char>& frame) {
  FrameHeader h;
  std::memcpy(&h, frame.data(), sizeof h);
  return h;
}

// encode → check_header → read_payload gives back the same bytes.
template <MsgType M>
void round_trip(uint64_t seq) {
  using T = typename PayloadOf<M>::type;
  SCOPED_TRACE("message type " + std::to_string(static_cast<int>(M)));
  T in = sample<T>(static_cast<unsigned char>(M));
  auto frame = encode(M, seq, in);
  ASSERT_EQ(frame.size(), sizeof(FrameHeader) + sizeof(T));
  FrameHeader h = header_of(frame);
  std::string why;
  EXPECT_EQ(check_header(h, &why), HeaderError::None) << why;
  EXPECT_EQ(h.magic, kMagic);
  EXPECT_EQ(h.major, kMajor);
  EXPECT_EQ(h.minor, kMinor);
  EXPECT_EQ(h.type, static_cast<uint16_t>(M));
  EXPECT_EQ(h.length, sizeof(T));
  EXPECT_EQ(h.seq, seq);
  EXPECT_EQ(payload_size(h.type), sizeof(T));
  T out;
  std::memset(&out, 0xEE, sizeof out);
  ASSERT_TRUE(read_payload(frame.data() + sizeof h, h.length, &out));
  EXPECT_EQ(std::memcmp(&in, &out, sizeof(T)), 0);
  // The wrong size is refused.
  EXPECT_FALSE(read_payload(frame.data() + sizeof h, h.length - 1, &out));
  std::vector<unsigned char> longer(sizeof(T) + 1);
  EXPECT_FALSE(read_payload(longer.data(), longer.size(), &out));
}

TEST(Protocol, EveryMessageRoundTrips) {
  round_trip<MsgType::Register>(1);
  round_trip<MsgType::RegisterReply>(2);
  round_trip<MsgType::Lease>(3);
  round_trip<MsgType::LeaseReply>(4);
  round_trip<MsgType::Release>(5);
  round_trip<MsgType::ReleaseReply>(6);
  round_trip<MsgType::Telemetry>(9);
  round_trip<MsgType::StatusQuery>(10);
  round_trip<MsgType::Shutdown>(11);
  round_trip<MsgType::Error>(0xFFFFFFFFFFFFFFFFull);
  round_trip<MsgType::Attach>(12);
  round_trip<MsgType::AttachReply>(13);
  round_trip<MsgType::NodeQuery>(14);
}

// Minor 1 adds types and changes no payload of minor 0: the wire numbers and sizes are
// pinned here as well as by the header's static_asserts.
TEST(Protocol, MinorOneAddsTheNodeMessages) {
  EXPECT_EQ(kMajor, 1);
  EXPECT_GE(kMinor, 1);
  EXPECT_EQ(kMinorNode, 1);
  EXPECT_EQ(static_cast<int>(MsgType::Attach), 14);
  EXPECT_EQ(static_cast<int>(MsgType::AttachReply), 15);
  EXPECT_EQ(static_cast<int>(MsgType::NodeQuery), 16);
  EXPECT_EQ(static_cast<int>(MsgType::NodeReply), 17);
  EXPECT_EQ(payload_size(14), 56u);
  EXPECT_EQ(payload_size(15), 40u);
  EXPECT_EQ(payload_size(16), 8u);
  EXPECT_EQ(payload_size(17), 0u) << "variable";
  EXPECT_EQ(offsetof(Attach, device_budget), 16u);
  EXPECT_EQ(offsetof(Attach, gpu_id), 24u);
  EXPECT_EQ(offsetof(AttachReply, link), 16u);
  EXPECT_EQ(offsetof(NodeHead, link), 8u);
  EXPECT_EQ(offsetof(ClientNode, device_budget), 24u);
  EXPECT_EQ(offsetof(ClientNode, gpu_id), 32u);
  // Minor 0's payloads are unchanged; its numbers 7 and 8 stay reserved.
  EXPECT_EQ(static_cast<int>(MsgType::ReleaseReply), 6);
  EXPECT_EQ(static_cast<int>(MsgType::Telemetry), 9);
  EXPECT_FALSE(known_type(7));
  EXPECT_FALSE(known_type(8));
  EXPECT_EQ(payload_size(static_cast<uint16_t>(MsgType::Register)), 96u);
  EXPECT_EQ(payload_size(static_cast<uint16_t>(MsgType::Error)), 128u);
  EXPECT_EQ(sizeof(ClientStatus), 152u);
  EXPECT_EQ(sizeof(StatusHead), 32u);
  // A frame of minor 0 is still taken.
  FrameHeader h = make_header(MsgType::Lease, sizeof(Lease), 1);
  h.minor = 0;
  EXPECT_EQ(check_header(h), HeaderError::None);
}

TEST(Protocol, NodeReplyRoundTripsForAnyCount) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{kMaxClients}}) {
    SCOPED_TRACE(n);
    NodeHead head = sample<NodeHead>(9);
    head.clients = 999;  // encode_node takes the count from the entries
    std::vector<ClientNode> cs;
    for (size_t i = 0; i < n; ++i) cs.push_back(sample<ClientNode>(static_cast<unsigned char>(i)));
    auto frame = encode_node(78, head, cs);
    FrameHeader h = header_of(frame);
    std::string why;
    ASSERT_EQ(check_header(h, &why), HeaderError::None) << why;
    EXPECT_EQ(h.type, static_cast<uint16_t>(MsgType::NodeReply));
    EXPECT_EQ(h.minor, kMinor);
    EXPECT_EQ(h.length, sizeof(NodeHead) + n * sizeof(ClientNode));
    NodeHead out{};
    std::vector<ClientNode> outs(5);
    ASSERT_TRUE(read_node(frame.data() + sizeof h, h.length, &out, &outs));
    EXPECT_EQ(out.clients, n);
    EXPECT_EQ(out.gpus, head.gpus);
    EXPECT_EQ(std::memcmp(&out.link, &head.link, sizeof(NodeLink)), 0);
    ASSERT_EQ(outs.size(), n);
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(std::memcmp(&outs[i], &cs[i], sizeof(ClientNode)), 0) << i;
  }
  // More entries than a frame may carry: the first kMaxClients go, and the count says so.
  std::vector<ClientNode> many(kMaxClients + 5, sample<ClientNode>(1));
  auto frame = encode_node(1, NodeHead{}, many);
  FrameHeader h = header_of(frame);
  ASSERT_EQ(check_header(h), HeaderError::None);
  NodeHead out{};
  std::vector<ClientNode> outs;
  ASSERT_TRUE(read_node(frame.data() + sizeof h, h.length, &out, &outs));
  EXPECT_EQ(outs.size(), kMaxClients);
}

TEST(Protocol, ReadNodeRejectsInconsistentCounts) {
  const size_t head = sizeof(NodeHead), entry = sizeof(ClientNode);
  auto payload = [&](uint32_t count, size_t entries) {
    std::vector<unsigned char> v(head + entries * entry, 0);
    NodeHead h{};
    h.clients = count;
    std::memcpy(v.data(), &h, sizeof h);
    return v;
  };
  NodeHead h{};
  std::vector<ClientNode> cs;
  EXPECT_TRUE(read_node(payload(2, 2).data(), head + 2 * entry, &h, &cs));
  EXPECT_EQ(cs.size(), 2u);
  EXPECT_FALSE(read_node(payload(2, 1).data(), head + entry, &h, &cs));
  EXPECT_FALSE(read_node(payload(0, 1).data(), head + entry, &h, &cs));
  EXPECT_FALSE(read_node(payload(1, 0).data(), head, &h, &cs));
  auto v = payload(1, 1);
  EXPECT_FALSE(read_node(v.data(), head + entry - 1, &h, &cs));
  EXPECT_FALSE(read_node(v.data(), head - 1, &h, &cs));
  EXPECT_FALSE(read_node(v.data(), 0, &h, &cs));
  auto big = payload(kMaxClients + 1, kMaxClients + 1);
  EXPECT_FALSE(read_node(big.data(), big.size(), &h, &cs));
  for (uint32_t count : {0xFFFFFFFFu, 0x80000000u, 0x04000001u}) {
    auto w = payload(count, 1);
    EXPECT_FALSE(read_node(w.data(), w.size(), &h, &cs)) << count;
  }
}

TEST(Protocol, StatusReplyRoundTripsForAnyCount) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{kMaxClients}}) {
    SCOPED_TRACE(n);
    StatusHead head = sample<StatusHead>(5);
    head.clients = 12345;  // encode_status takes the count from the entries
    std::vector<ClientStatus> cs;
    for (size_t i = 0; i < n; ++i) cs.push_back(sample<ClientStatus>(static_cast<unsigned char>(i)));
    auto frame = encode_status(77, head, cs);
    FrameHeader h = header_of(frame);
    std::string why;
    ASSERT_EQ(check_header(h, &why), HeaderError::None) << why;
    EXPECT_EQ(h.type, static_cast<uint16_t>(MsgType::StatusReply));
    EXPECT_EQ(h.length, sizeof(StatusHead) + n * sizeof(ClientStatus));
    EXPECT_EQ(h.seq, 77u);
    StatusHead out{};
    std::vector<ClientStatus> outs(2);
    ASSERT_TRUE(read_status(frame.data() + sizeof h, h.length, &out, &outs));
    EXPECT_EQ(out.clients, n);
    EXPECT_EQ(out.pool_bytes, head.pool_bytes);
    EXPECT_EQ(out.used_bytes, head.used_bytes);
    EXPECT_EQ(out.daemon_pid, head.daemon_pid);
    ASSERT_EQ(outs.size(), n);
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(std::memcmp(&outs[i], &cs[i], sizeof(ClientStatus)), 0) << i;
  }
}

TEST(Protocol, ReadPayloadTerminatesEveryString) {
  std::vector<unsigned char> raw(256, 'x');
  Register r;
  ASSERT_TRUE(read_payload(raw.data(), sizeof r, &r));
  EXPECT_EQ(std::strlen(r.command), sizeof r.command - 1);
  RegisterReply rr;
  ASSERT_TRUE(read_payload(raw.data(), sizeof rr, &rr));
  EXPECT_EQ(std::strlen(rr.segment), sizeof rr.segment - 1);
  Error e;
  ASSERT_TRUE(read_payload(raw.data(), sizeof e, &e));
  EXPECT_EQ(std::strlen(e.message), sizeof e.message - 1);
  std::vector<unsigned char> st(sizeof(StatusHead) + sizeof(ClientStatus), 'x');
  StatusHead h{};
  h.clients = 1;
  std::memcpy(st.data(), &h, sizeof h);
  std::vector<ClientStatus> cs;
  ASSERT_TRUE(read_status(st.data(), st.size(), &h, &cs));
  ASSERT_EQ(cs.size(), 1u);
  EXPECT_EQ(std::strlen(cs[0].command), sizeof cs[0].command - 1);
  Attach a;
  ASSERT_TRUE(read_payload(raw.data(), sizeof a, &a));
  EXPECT_EQ(std::strlen(a.gpu_id), sizeof a.gpu_id - 1);
  std::vector<unsigned char> nd(sizeof(NodeHead) + 2 * sizeof(ClientNode), 'x');
  NodeHead nh{};
  nh.clients = 2;
  std::memcpy(nd.data(), &nh, sizeof nh);
  std::vector<ClientNode> ns;
  ASSERT_TRUE(read_node(nd.data(), nd.size(), &nh, &ns));
  ASSERT_EQ(ns.size(), 2u);
  for (auto& n : ns) EXPECT_EQ(std::strlen(n.gpu_id), sizeof n.gpu_id - 1);
}

FrameHeader good(MsgType t) { return make_header(t, static_cast<uint32_t>(payload_size(static_cast<uint16_t>(t))), 1); }

TEST(Protocol, CheckHeaderRejectsEachErrorClass) {
  std::string why;
  FrameHeader h = good(MsgType::Lease);
  h.magic = 0x4C46464E;
  EXPECT_EQ(check_header(h, &why), HeaderError::BadMagic);
  EXPECT_NE(why.find("bad magic"), std::string::npos) << why;
  h.magic = 0;
  EXPECT_EQ(check_header(h), HeaderError::BadMagic);  // `why` is optional

  for (uint16_t major : {uint16_t{0}, uint16_t{2}, uint16_t{0xFFFF}}) {
    h = good(MsgType::Lease);
    h.major = major;
    h.minor = 7;
    why.clear();
    EXPECT_EQ(check_header(h, &why), HeaderError::OtherMajor) << major;
    // The message names both versions: theirs (major.minor) and ours.
    EXPECT_NE(why.find(std::to_string(major) + ".7"), std::string::npos) << why;
    EXPECT_NE(why.find(std::to_string(kMajor) + ".x"), std::string::npos) << why;
  }
  // Any minor of our major is accepted.
  h = good(MsgType::Lease);
  h.minor = 0xFFFF;
  EXPECT_EQ(check_header(h), HeaderError::None);

  // 7 and 8 are reserved (once PlanRequest/PlanReply): unknown on the wire.
  for (uint16_t type : {uint16_t{0}, uint16_t{7}, uint16_t{8}, uint16_t{18}, uint16_t{100}, uint16_t{0xFFFF}}) {
    h = good(MsgType::Lease);
    h.type = type;
    why.clear();
    EXPECT_EQ(check_header(h, &why), HeaderError::UnknownType) << type;
    EXPECT_NE(why.find(std::to_string(type)), std::string::npos) << why;
  }

  // Every fixed-size type: exactly its size, nothing else.
  for (uint16_t t = 1; t <= static_cast<uint16_t>(MsgType::NodeReply); ++t) {
    if (t == static_cast<uint16_t>(MsgType::StatusReply) || t == static_cast<uint16_t>(MsgType::NodeReply)) continue;
    if (t == 7 || t == 8) continue;  // reserved
    size_t n = payload_size(t);
    ASSERT_GT(n, 0u) << t;
    h = make_header(static_cast<MsgType>(t), static_cast<uint32_t>(n), 1);
    EXPECT_EQ(check_header(h), HeaderError::None) << t;
    for (uint64_t len : {uint64_t{0}, uint64_t{n - 1}, uint64_t{n + 1}, uint64_t{2 * n}, uint64_t{0xFFFFFFFF}}) {
      h.length = static_cast<uint32_t>(len);
      why.clear();
      EXPECT_EQ(check_header(h, &why), HeaderError::BadLength) << "type " << t << " length " << len;
      EXPECT_NE(why.find("expected " + std::to_string(n)), std::string::npos) << why;
    }
  }

  // StatusReply: a head and whole entries, at most kMaxClients of them.
  const uint64_t head = sizeof(StatusHead), entry = sizeof(ClientStatus);
  h = make_header(MsgType::StatusReply, 0, 1);
  for (uint64_t len : {head, head + entry, head + kMaxClients * entry}) {
    h.length = static_cast<uint32_t>(len);
    EXPECT_EQ(check_header(h), HeaderError::None) << len;
  }
  for (uint64_t len : {uint64_t{0}, head - 1, head + 1, head + entry - 1, head + entry + 1,
                       head + (kMaxClients + 1) * entry, uint64_t{0xFFFFFFFF}}) {
    h.length = static_cast<uint32_t>(len);
    why.clear();
    EXPECT_EQ(check_header(h, &why), HeaderError::BadLength) << len;
    EXPECT_NE(why.find("status reply length"), std::string::npos) << why;
  }

  // NodeReply: the same rule with its own head and entries.
  const uint64_t nhead = sizeof(NodeHead), nentry = sizeof(ClientNode);
  h = make_header(MsgType::NodeReply, 0, 1);
  for (uint64_t len : {nhead, nhead + nentry, nhead + kMaxClients * nentry}) {
    h.length = static_cast<uint32_t>(len);
    EXPECT_EQ(check_header(h), HeaderError::None) << len;
  }
  for (uint64_t len : {uint64_t{0}, nhead - 1, nhead + 1, nhead + nentry - 1, nhead + nentry + 1,
                       nhead + (kMaxClients + 1) * nentry, uint64_t{0xFFFFFFFF}}) {
    h.length = static_cast<uint32_t>(len);
    why.clear();
    EXPECT_EQ(check_header(h, &why), HeaderError::BadLength) << len;
    EXPECT_NE(why.find("node reply length"), std::string::npos) << why;
  }
}

TEST(Protocol, ReadStatusRejectsInconsistentCounts) {
  const size_t head = sizeof(StatusHead), entry = sizeof(ClientStatus);
  auto payload = [&](uint32_t count, size_t entries) {
    std::vector<unsigned char> v(head + entries * entry, 0);
    StatusHead h{};
    h.clients = count;
    std::memcpy(v.data(), &h, sizeof h);
    return v;
  };
  StatusHead h{};
  std::vector<ClientStatus> cs;
  EXPECT_TRUE(read_status(payload(2, 2).data(), head + 2 * entry, &h, &cs));
  EXPECT_EQ(cs.size(), 2u);
  EXPECT_FALSE(read_status(payload(2, 1).data(), head + entry, &h, &cs));  // says 2, has 1
  EXPECT_FALSE(read_status(payload(0, 1).data(), head + entry, &h, &cs));  // says 0, has 1
  EXPECT_FALSE(read_status(payload(1, 0).data(), head, &h, &cs));
  auto v = payload(1, 1);
  EXPECT_FALSE(read_status(v.data(), head + entry - 1, &h, &cs));  // a cut entry
  EXPECT_FALSE(read_status(v.data(), head - 1, &h, &cs));          // a cut head
  EXPECT_FALSE(read_status(v.data(), 0, &h, &cs));
  // A count past kMaxClients, even with bytes to match, and counts that would wrap.
  auto big = payload(kMaxClients + 1, kMaxClients + 1);
  EXPECT_FALSE(read_status(big.data(), big.size(), &h, &cs));
  for (uint32_t count : {0xFFFFFFFFu, 0x80000000u, 0x1AF286BCu}) {
    auto w = payload(count, 1);
    EXPECT_FALSE(read_status(w.data(), w.size(), &h, &cs)) << count;
  }
}

TEST(Protocol, StatusNamesAreDistinct) {
  std::vector<std::string> names;
  for (uint32_t s = 0; s <= 6; ++s) names.push_back(status_name(static_cast<Status>(s)));
  for (size_t i = 0; i < names.size(); ++i)
    for (size_t j = i + 1; j < names.size(); ++j) EXPECT_NE(names[i], names[j]);
  EXPECT_STREQ(status_name(static_cast<Status>(99)), "unknown status");
}

// A stream of every kind of frame.
std::vector<std::vector<unsigned char>> all_frames() {
  std::vector<std::vector<unsigned char>> v;
  v.push_back(encode(MsgType::Register, 1, sample<Register>(1)));
  v.push_back(encode(MsgType::RegisterReply, 2, sample<RegisterReply>(2)));
  v.push_back(encode(MsgType::Lease, 3, sample<Lease>(3)));
  v.push_back(encode(MsgType::LeaseReply, 4, sample<LeaseReply>(4)));
  v.push_back(encode_status(5, sample<StatusHead>(5), {sample<ClientStatus>(1), sample<ClientStatus>(2)}));
  v.push_back(encode(MsgType::Release, 6, sample<Release>(6)));
  v.push_back(encode(MsgType::ReleaseReply, 7, sample<ReleaseReply>(7)));
  v.push_back(encode(MsgType::Telemetry, 10, sample<Telemetry>(10)));
  v.push_back(encode(MsgType::StatusQuery, 11, sample<StatusQuery>(11)));
  v.push_back(encode_status(12, sample<StatusHead>(12), {}));
  v.push_back(encode(MsgType::Shutdown, 13, sample<Shutdown>(13)));
  v.push_back(encode(MsgType::Error, 14, sample<Error>(14)));
  v.push_back(encode(MsgType::Attach, 15, sample<Attach>(15)));
  v.push_back(encode(MsgType::AttachReply, 16, sample<AttachReply>(16)));
  v.push_back(encode(MsgType::NodeQuery, 17, sample<NodeQuery>(17)));
  v.push_back(encode_node(18, sample<NodeHead>(18), {sample<ClientNode>(1), sample<ClientNode>(2)}));
  v.push_back(encode_node(19, sample<NodeHead>(19), {}));
  return v;
}

void expect_frame(const std::vector<unsigned char>& want, const FrameHeader& h, const std::vector<unsigned char>& p) {
  ASSERT_EQ(sizeof h + p.size(), want.size());
  EXPECT_EQ(std::memcmp(&h, want.data(), sizeof h), 0);
  EXPECT_EQ(std::memcmp(p.data(), want.data() + sizeof h, p.size()), 0);
}

TEST(FrameReader, ByteByByte) {
  auto frames = all_frames();
  FrameReader r;
  FrameHeader h{};
  std::vector<unsigned char> p;
  size_t got = 0;
  for (auto& f : frames) {
    for (size_t i = 0; i < f.size(); ++i) {
      EXPECT_FALSE(r.next(&h, &p)) << "a frame before its last byte (frame " << got << ", byte " << i << ")";
      r.feed(&f[i], 1);
    }
    ASSERT_TRUE(r.next(&h, &p)) << "frame " << got;
    expect_frame(f, h, p);
    EXPECT_FALSE(r.next(&h, &p));
    ++got;
  }
  EXPECT_EQ(got, frames.size());
  EXPECT_FALSE(r.failed());
}

TEST(FrameReader, SeveralFramesInOneFeedAndSplitsAnywhere) {
  auto frames = all_frames();
  std::vector<unsigned char> stream;
  for (auto& f : frames) stream.insert(stream.end(), f.begin(), f.end());
  FrameHeader h{};
  std::vector<unsigned char> p;
  {
    FrameReader r;
    r.feed(stream.data(), stream.size());
    for (auto& f : frames) {
      ASSERT_TRUE(r.next(&h, &p));
      expect_frame(f, h, p);
    }
    EXPECT_FALSE(r.next(&h, &p));
    EXPECT_FALSE(r.failed());
  }
  // Random chunk sizes, twice over the stream, with a seeded RNG.
  std::mt19937 rng(42);
  for (int round = 0; round < 50; ++round) {
    FrameReader r;
    size_t got = 0, at = 0;
    while (at < stream.size()) {
      size_t n = std::min<size_t>(stream.size() - at, 1 + rng() % 200);
      r.feed(stream.data() + at, n);
      at += n;
      while (r.next(&h, &p)) {
        ASSERT_LT(got, frames.size());
        expect_frame(frames[got++], h, p);
      }
      ASSERT_FALSE(r.failed());
    }
    EXPECT_EQ(got, frames.size()) << "round " << round;
  }
}

TEST(FrameReader, PoisonsOnABadHeader) {
  auto ok = encode(MsgType::Lease, 1, Lease{4096});
  auto bad = ok;
  bad[0] ^= 0xFF;  // magic
  std::vector<unsigned char> stream = ok;
  stream.insert(stream.end(), bad.begin(), bad.end());
  stream.insert(stream.end(), ok.begin(), ok.end());
  FrameReader r;
  r.feed(stream.data(), stream.size());
  FrameHeader h{};
  std::vector<unsigned char> p;
  ASSERT_TRUE(r.next(&h, &p));
  EXPECT_FALSE(r.next(&h, &p));
  EXPECT_TRUE(r.failed());
  EXPECT_NE(r.error().find("bad magic"), std::string::npos) << r.error();
  // Poisoned for good: a good frame after it is not taken.
  r.feed(ok.data(), ok.size());
  EXPECT_FALSE(r.next(&h, &p));
  EXPECT_TRUE(r.failed());

  // A bad length fails at once: the reader does not wait for 4 GiB that will never come.
  FrameReader r2;
  FrameHeader big = make_header(MsgType::StatusReply, 0xFFFFFFF0u, 1);
  r2.feed(&big, sizeof big);
  EXPECT_FALSE(r2.next(&h, &p));
  EXPECT_TRUE(r2.failed());
  EXPECT_NE(r2.error().find("status reply length"), std::string::npos) << r2.error();

  // Other major: poisoned with a message that names both versions.
  FrameReader r3;
  FrameHeader other = make_header(MsgType::Lease, sizeof(Lease), 1);
  other.major = 2;
  other.minor = 0;
  r3.feed(&other, sizeof other);
  EXPECT_FALSE(r3.next(&h, &p));
  EXPECT_TRUE(r3.failed());
  EXPECT_NE(r3.error().find("2.0"), std::string::npos) << r3.error();
  EXPECT_NE(r3.error().find("1.x"), std::string::npos) << r3.error();

  // A partial header is not an error, only incomplete.
  FrameReader r4;
  r4.feed(bad.data(), 3);
  EXPECT_FALSE(r4.next(&h, &p));
  EXPECT_FALSE(r4.failed());
}

}  // namespace
}  // namespace offload::proto
