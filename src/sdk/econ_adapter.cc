#include "sdk/econ_adapter.h"

#include <algorithm>
#include <utility>

namespace laissez::sdk {

// ---- OrderBookView ----

void BookReads::Quoted(VertexId v, Price p) {
  // Every distinct price read is kept: a round may see a vertex move under
  // its own calls (a later request reads what an earlier one changed), and
  // the round's answers used each of them.
  for (const auto& [seen, price] : quotes)
    if (seen == v && price == p) return;
  quotes.emplace_back(v, p);
}

OrderBookView::OrderBookView(MarketClient* client, VertexId scope, NodeId held, Price current_limit,
                             uint32_t request_held, uint32_t request_count, BookReads* reads)
    : client_(client),
      scope_(scope),
      held_(held),
      current_limit_(current_limit),
      request_held_(request_held),
      request_count_(request_count),
      reads_(reads) {}

Micros OrderBookView::now() const { return client_->Now(); }

const market::VertexQuote& OrderBookView::vertex_quote() const {
  if (!quote_) {
    if (reads_) reads_->unwatched = true;  // Counts move without the price.
    auto q = client_->Quote(scope_, /*with_depth=*/false);
    quote_ = q.ok() ? std::move(q).value() : market::VertexQuote{};
  }
  return *quote_;
}

Price OrderBookView::quote() const {
  if (quote_) return quote_->quote;
  if (!price_) {
    auto p = client_->QuotePrice(scope_);
    price_ = p.ok() ? *p : kInfPrice;
    if (reads_) reads_->Quoted(scope_, *price_);
  }
  return *price_;
}
uint32_t OrderBookView::free_count() const { return vertex_quote().free; }

Price OrderBookView::QuoteOf(std::string_view vertex_name) const {
  auto v = client_->FindVertex(vertex_name);
  if (!v.ok()) return kInfPrice;
  auto p = client_->QuotePrice(*v);
  Price price = p.ok() ? *p : kInfPrice;
  if (reads_) reads_->Quoted(*v, price);
  return price;
}

const market::EvictionQuote* OrderBookView::eviction() const {
  if (!held_.valid()) return nullptr;
  if (reads_) reads_->unwatched = true;
  if (!eviction_read_) {
    eviction_read_ = true;
    auto q = client_->GetEvictionQuote(held_);
    if (q.ok()) eviction_ = std::move(q).value();
  }
  return eviction_ ? &*eviction_ : nullptr;
}

Money OrderBookView::balance() const {
  if (!balance_) {
    if (reads_) reads_->unwatched = true;
    auto b = client_->Balance();
    balance_ = b.ok() ? *b : 0;
  }
  return *balance_;
}

// ---- EconAdapter ----

EconAdapter::EconAdapter(MarketClient* client, PricingStrategy* strategy, AdapterListener* listener)
    : client_(client), strategy_(strategy), listener_(listener) {
  const PricingStrategy* s = strategy_;
  for (ChainLine& line : chain_) {
    if (s == nullptr) break;
    if (const PricingStrategy* next = s->inner()) {
      line = {next, 64};
      s = next;
    } else {
      const std::span<const std::byte> t = s->table();
      if (!t.empty()) line = {t.data(), t.size()};
      break;
    }
  }
}

Result<VertexId> EconAdapter::ScopeOf(const NodeSpec& spec) {
  std::string key = spec.location.empty() ? spec.node_type : spec.node_type + "/" + spec.location;
  auto it = scope_cache_.find(key);
  if (it != scope_cache_.end()) return it->second;
  auto v = client_->FindVertex(key);
  if (!v.ok()) return InvalidArgument("node_type: no vertex '" + key + "' in the market");
  scope_cache_.emplace(std::move(key), *v);
  return *v;
}

Result<RequestId> EconAdapter::Add(Request request) {
  if (request.options.empty()) return InvalidArgument("options: a request needs at least one node spec");
  if (request.count == 0) return InvalidArgument("count: must be positive");
  if (request.mixed_types && request.gang)
    return InvalidArgument("mixed_types: a gang runs on one type; set gang = false to mix types");
  RequestState rs;
  rs.priced.reserve(request.options.size());
  // The options move into the round's buffer and the request keeps none (one
  // copy of each spec, not two: review finding, issue 12); `request` is this
  // call's own, so an invalid option leaves nothing behind.
  for (NodeSpec& o : request.options) {
    if (o.node_type.empty()) return InvalidArgument("options.node_type: must not be empty");
    auto scope = ScopeOf(o);
    if (!scope.ok()) return scope.status();
    rs.priced.push_back(PricedOption{*scope, o.locality, o.rel_to, {}});
    rs.priced.back().spec = std::move(o);
  }
  request.options.clear();
  // Allocated now, beside the options: a round reads both (issue 12). A
  // large request grows its list as nodes arrive instead.
  rs.nodes.reserve(std::min<uint32_t>(request.count, 64));
  RequestId id = next_id_++;
  rs.request = std::move(request);
  requests_.emplace(id, std::move(rs));
  dirty_ = true;
  return id;
}

Status EconAdapter::CancelOne(RequestState& rs, size_t index) {
  OrderId id = rs.orders[index].id;
  rs.orders.erase(rs.orders.begin() + static_cast<ptrdiff_t>(index));
  order_owner_.erase(id.value);
  ++stats_.orders_cancelled;
  Status s = client_->CancelOrder(id);
  // NOT_FOUND: the order was filled or cancelled meanwhile; its events follow.
  if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
  return Status::Ok();
}

Status EconAdapter::CancelAll(RequestState& rs) {
  Status first;
  while (!rs.orders.empty()) {
    Status s = CancelOne(rs, rs.orders.size() - 1);
    if (first.ok() && !s.ok()) first = s;
  }
  if (rs.nodes.empty()) rs.option = -1;
  return first;
}

Status EconAdapter::Remove(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return NotFound("request: unknown request id");
  RequestState& rs = it->second;
  Status first = CancelAll(rs);
  std::vector<HeldNode> nodes = rs.nodes;
  requests_.erase(it);
  // The request is gone, so later release events find no owner: report the
  // losses here.
  for (const HeldNode& h : nodes) {
    node_owner_.erase(h.node.value);
    ++stats_.relinquished;
    Status s = client_->Relinquish(h.node);
    if (first.ok() && !s.ok() && s.code() != StatusCode::kNotFound &&
        s.code() != StatusCode::kPermissionDenied)
      first = s;
    if (listener_) listener_->OnNodeLost(id, h.node, market::kReasonRelinquish);
  }
  return first;
}

Status EconAdapter::Resize(RequestId id, uint32_t count) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return NotFound("request: unknown request id");
  if (count == 0) return InvalidArgument("count: must be positive (use Remove to drop a request)");
  RequestState& rs = it->second;
  rs.request.count = count;
  dirty_ = true;
  Status first;
  // Relinquish the most recently acquired nodes beyond the new count.
  while (rs.nodes.size() > count) {
    NodeId n = rs.nodes.back().node;
    Status s = client_->Relinquish(n);
    ++stats_.relinquished;
    // The release event removes it from `nodes`; if it does not arrive
    // synchronously, drop it here (LoseNode is idempotent).
    if (!rs.nodes.empty() && rs.nodes.back().node == n) {
      node_owner_.erase(n.value);
      rs.nodes.pop_back();
      if (listener_) listener_->OnNodeLost(id, n, market::kReasonRelinquish);
    }
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

Status EconAdapter::Yield(RequestId id, NodeId node) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return NotFound("request: unknown request id");
  auto& nodes = it->second.nodes;
  if (std::none_of(nodes.begin(), nodes.end(), [&](const HeldNode& h) { return h.node == node; }))
    return NotFound("node: not held by this request");
  ++stats_.relinquished;
  dirty_ = true;
  return client_->Relinquish(node);
}

namespace {
// Fetches the cache lines of [p, p + bytes), at most four.
void FetchLines(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t off = 0; off < bytes && off < 4 * 64; off += 64) __builtin_prefetch(c + off);
}
}  // namespace

void EconAdapter::Prefetch(int level) const {
  if (level == 0) {
    FetchLines(this, sizeof(*this));
    return;
  }
  if (requests_.empty()) return;
  const auto& entry = *requests_.begin();
  if (level == 1) {
    FetchLines(&entry, sizeof(entry));
    FetchLines(client_, 64);
    FetchLines(strategy_, 64);
    if (!reads_.quotes.empty()) FetchLines(reads_.quotes.data(), reads_.quotes.size() * sizeof(reads_.quotes[0]));
    return;
  }
  if (level == 2) {
    const RequestState& rs = entry.second;
    if (!rs.priced.empty()) FetchLines(rs.priced.data(), rs.priced.size() * sizeof(PricedOption));
    if (!rs.nodes.empty()) FetchLines(rs.nodes.data(), rs.nodes.size() * sizeof(HeldNode));
  }
  // The market's records of the held nodes, whose limits the round sets
  // (issue 12: three cache misses at the head of each SetLimit): the record
  // at level 3, its key at 4, from the held-node buffer level 2 fetched.
  if (level == 3 || level == 4) {
    for (const HeldNode& h : entry.second.nodes) client_->PrefetchNode(h.node, level - 3);
  }
  // The strategy chain, one object per level (issue 12: its decorators and
  // the throughput table are separate heap objects), as the constructor
  // listed it.
  const size_t d = static_cast<size_t>(level - 2);
  if (d < chain_.size() && chain_[d].p != nullptr) FetchLines(chain_[d].p, chain_[d].bytes);
}

const EconAdapter::RequestState* EconAdapter::request(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second;
}

std::optional<RequestId> EconAdapter::RequestOf(NodeId node) const {
  auto it = node_owner_.find(node.value);
  if (it == node_owner_.end()) return std::nullopt;
  return it->second;
}

uint32_t EconAdapter::held_count() const { return static_cast<uint32_t>(node_owner_.size()); }

void EconAdapter::OnEvents(std::span<const market::Event> events) {
  if (in_reprice_) {
    deferred_.insert(deferred_.end(), events.begin(), events.end());
    return;
  }
  for (const market::Event& e : events) ApplyEvent(e);
}

void EconAdapter::LoseNode(NodeId node, uint8_t reasons) {
  auto it = node_owner_.find(node.value);
  if (it == node_owner_.end()) return;
  RequestId rid = it->second;
  node_owner_.erase(it);
  auto rit = requests_.find(rid);
  if (rit != requests_.end()) {
    auto& nodes = rit->second.nodes;
    nodes.erase(std::remove_if(nodes.begin(), nodes.end(), [&](const HeldNode& h) { return h.node == node; }),
                nodes.end());
    if (nodes.empty() && rit->second.orders.empty()) rit->second.option = -1;
  }
  dirty_ = true;
  if (listener_) listener_->OnNodeLost(rid, node, reasons);
}

void EconAdapter::ApplyEvent(const market::Event& e) {
  const TenantId me = client_->tenant();
  switch (e.type) {
    case market::EventType::kAllocated:
    case market::EventType::kTransferred: {
      if (e.type == market::EventType::kTransferred && e.other == me && e.tenant != me) {
        LoseNode(e.node, e.reasons ? e.reasons : static_cast<uint8_t>(market::kReasonOutbid));
        break;
      }
      if (e.tenant != me) break;
      auto oit = order_owner_.find(e.order.value);
      if (oit == order_owner_.end()) break;
      RequestId rid = oit->second;
      auto rit = requests_.find(rid);
      if (rit == requests_.end()) break;
      RequestState& rs = rit->second;
      if (node_owner_.count(e.node.value)) break;  // Duplicate.
      int option = rs.option;
      for (const OpenOrder& o : rs.orders)
        if (o.id == e.order) option = o.option;
      rs.nodes.push_back(HeldNode{e.node, e.price, false, 0, option});
      node_owner_[e.node.value] = rid;
      for (size_t i = 0; i < rs.orders.size(); ++i) {
        if (rs.orders[i].id != e.order) continue;
        if (++rs.orders[i].filled >= rs.orders[i].count) {
          order_owner_.erase(e.order.value);
          rs.orders.erase(rs.orders.begin() + static_cast<ptrdiff_t>(i));
        }
        break;
      }
      dirty_ = true;
      if (listener_) listener_->OnNodeGained(rid, e.node, e.price);
      break;
    }
    case market::EventType::kReleased:
      if (e.tenant == me) LoseNode(e.node, e.reasons);
      break;
    case market::EventType::kNotice: {
      if (e.tenant != me) break;
      auto it = node_owner_.find(e.node.value);
      if (it == node_owner_.end()) break;
      auto rit = requests_.find(it->second);
      if (rit != requests_.end()) {
        for (HeldNode& h : rit->second.nodes) {
          if (h.node == e.node) {
            h.contested = true;
            h.deadline = e.deadline;
          }
        }
      }
      dirty_ = true;
      if (listener_) listener_->OnNotice(it->second, e.node, e.deadline, e.price, e.reasons);
      break;
    }
    case market::EventType::kContestEnded: {
      auto it = node_owner_.find(e.node.value);
      if (it == node_owner_.end()) break;
      auto rit = requests_.find(it->second);
      if (rit != requests_.end()) {
        for (HeldNode& h : rit->second.nodes)
          if (h.node == e.node) h.contested = false;
      }
      dirty_ = true;
      if (listener_) listener_->OnContestEnded(it->second, e.node);
      break;
    }
    case market::EventType::kOrderCancelled:
    case market::EventType::kOrderFilled: {
      if (e.tenant.valid() && e.tenant != me) break;
      auto oit = order_owner_.find(e.order.value);
      if (oit == order_owner_.end()) break;
      RequestId rid = oit->second;
      order_owner_.erase(oit);
      auto rit = requests_.find(rid);
      if (rit == requests_.end()) break;
      auto& orders = rit->second.orders;
      orders.erase(std::remove_if(orders.begin(), orders.end(), [&](const OpenOrder& o) { return o.id == e.order; }),
                   orders.end());
      if (rit->second.nodes.empty() && orders.empty()) rit->second.option = -1;
      dirty_ = true;
      if (e.type == market::EventType::kOrderCancelled && listener_)
        listener_->OnOrderCancelled(rid, e.cancel_reason);
      break;
    }
    case market::EventType::kCharged:
      if (e.tenant == me && listener_) listener_->OnCharged(e.node, e.amount);
      break;
    case market::EventType::kPriceChanged:
    case market::EventType::kExhausted:
    case market::EventType::kGangDropped:
      dirty_ = true;
      break;
    default:
      break;
  }
}

Status EconAdapter::Place(RequestId id, RequestState& rs, const NodeSpec& spec, VertexId scope, uint32_t count,
                          Price price) {
  market::OrderSpec os;
  os.scope = scope;
  os.price = price;
  os.count = count;
  os.locality = spec.locality;
  os.rel_to = spec.locality == market::Locality::kAny ? NodeId() : spec.rel_to;
  auto placed = client_->PlaceOrder(os);
  if (!placed.ok()) {
    ++stats_.rejected;
    return placed.status();
  }
  ++stats_.orders_placed;
  rs.orders.push_back(OpenOrder{*placed, count, 0, price, rs.option});
  order_owner_[placed->value] = id;
  return Status::Ok();
}

bool EconAdapter::NeedsReprice(Micros now) {
  bool needed = dirty_ || retry_ || reads_.unwatched || now >= reprice_at_;
  for (size_t i = 0; !needed && i < reads_.quotes.size(); ++i) {
    auto p = client_->QuotePrice(reads_.quotes[i].first);
    needed = (p.ok() ? *p : kInfPrice) != reads_.quotes[i].second;
  }
  if (!needed) ++stats_.reprices_skipped;
  return needed;
}

Status EconAdapter::Reprice() {
  in_reprice_ = true;
  ++stats_.reprices;
  reads_.quotes.clear();  // Keeps the capacity: no allocation per round.
  reads_.unwatched = false;
  reprice_at_ = kNever;
  Status first;
  for (auto& [id, rs] : requests_) {
    Status s = RepriceRequest(id, rs);
    if (first.ok() && !s.ok()) first = s;
  }
  retry_ = !first.ok();
  in_reprice_ = false;
  dirty_ = false;
  // Apply what arrived meanwhile; it may mark the adapter dirty again for the next tick.
  while (!deferred_.empty()) {
    std::vector<market::Event> events;
    events.swap(deferred_);
    for (const market::Event& e : events) ApplyEvent(e);
  }
  return first;
}

Status EconAdapter::RepriceRequest(RequestId id, RequestState& rs) {
  Status first;
  auto note = [&](Status s) {
    if (!s.ok()) {
      if (first.ok()) first = s;
    }
  };

  // 1. Retention limits of the held nodes.
  const uint32_t held = static_cast<uint32_t>(rs.nodes.size());
  if (held > 0) {
    // The list does not change here: the market's answers to these calls
    // (release events) wait in `deferred_` until the round is done.
    for (HeldNode& h : rs.nodes) {
      const int option = h.option >= 0 ? h.option : rs.option;
      if (option < 0) continue;
      PricedOption& po = rs.priced[static_cast<size_t>(option)];
      NodeSpec& spec = po.spec;
      spec.locality = po.locality;
      spec.rel_to = po.rel_to;
      spec.held = h.node;
      spec.count = 1;
      OrderBookView view(client_, po.scope, h.node, h.limit, held, rs.request.count, &reads_);
      ++stats_.price_calls;
      std::optional<Price> limit = strategy_->Price(spec, view);
      reprice_at_ = std::min(reprice_at_, strategy_->NextChange(spec, view.now()));
      if (!limit) {
        ++stats_.relinquished;
        Status s = client_->Relinquish(h.node);
        if (!s.ok()) ++stats_.rejected;
        note(s);
        continue;
      }
      Price l = std::max<Price>(0, *limit);
      if (l == h.limit) continue;
      Status s = client_->SetLimit(h.node, l);
      if (s.ok()) {
        ++stats_.limits_set;
        h.limit = l;
      } else {
        ++stats_.rejected;
        note(s);
      }
    }
  }

  // 2. Bids for the missing nodes.
  const uint32_t missing = rs.request.count > held ? rs.request.count - held : 0;
  if (missing == 0) {
    note(CancelAll(rs));
    return first;
  }
  // Nodes already promised to open orders are not missing twice.
  int best = -1;
  Price best_bid = 0;
  bool best_obtainable = false;
  Price best_surplus = 0;
  const size_t n_options = rs.priced.size();
  for (size_t i = 0; i < n_options; ++i) {
    if (held > 0 && !rs.request.mixed_types && static_cast<int>(i) != rs.option) continue;
    PricedOption& po = rs.priced[i];
    NodeSpec& spec = po.spec;
    spec.locality = po.locality;
    spec.rel_to = po.rel_to;
    spec.count = missing;
    spec.held = NodeId();
    if (spec.locality != market::Locality::kAny && !spec.rel_to.valid()) {
      if (held > 0) {
        spec.rel_to = rs.nodes.front().node;
      } else {
        spec.locality = market::Locality::kAny;  // Nothing to be near yet.
      }
    }
    OrderBookView view(client_, po.scope, NodeId(), 0, held, rs.request.count, &reads_);
    ++stats_.price_calls;
    std::optional<Price> bid = strategy_->Price(spec, view);
    reprice_at_ = std::min(reprice_at_, strategy_->NextChange(spec, view.now()));
    if (!bid) continue;
    Price b = std::max<Price>(0, *bid);
    Price q = view.quote();
    bool obtainable = q != kInfPrice && b >= q;
    Price surplus = q == kInfPrice ? -kInfPrice : b - q;
    bool better = best < 0 || (obtainable && !best_obtainable) ||
                  (obtainable == best_obtainable && surplus > best_surplus);
    if (better) {
      best = static_cast<int>(i);
      best_bid = b;
      best_obtainable = obtainable;
      best_surplus = surplus;
    }
  }
  if (best < 0) {
    note(CancelAll(rs));
    return first;
  }
  // The priced spec of the best option keeps its anchoring (locality, rel_to).
  const NodeSpec& best_spec = rs.priced[static_cast<size_t>(best)].spec;
  const VertexId best_scope = rs.priced[static_cast<size_t>(best)].scope;
  if (best != rs.option) {
    note(CancelAll(rs));
    rs.option = best;
  }
  const bool gang = rs.request.gang && missing > 1;
  // Outstanding nodes of the open orders.
  uint32_t outstanding = 0;
  for (const OpenOrder& o : rs.orders) outstanding += o.count - o.filled;
  if (gang) {
    // One all-or-nothing order for exactly the missing nodes.
    if (rs.orders.size() != 1 || outstanding != missing || rs.orders[0].filled != 0) {
      note(CancelAll(rs));
      rs.option = best;
      note(Place(id, rs, best_spec, best_scope, missing, best_bid));
    } else if (rs.orders[0].price != best_bid) {
      Status s = client_->UpdateOrder(rs.orders[0].id, best_bid);
      if (s.ok()) {
        ++stats_.orders_updated;
        rs.orders[0].price = best_bid;
      } else {
        ++stats_.rejected;
        note(s);
      }
    }
    return first;
  }
  // Single-node orders, one per missing node.
  while (outstanding > missing && !rs.orders.empty()) {
    outstanding -= rs.orders.back().count - rs.orders.back().filled;
    note(CancelOne(rs, rs.orders.size() - 1));
  }
  for (size_t i = 0; i < rs.orders.size(); ++i) {
    if (rs.orders[i].count != 1) continue;
    if (rs.orders[i].price == best_bid) continue;
    Status s = client_->UpdateOrder(rs.orders[i].id, best_bid);
    if (s.ok()) {
      ++stats_.orders_updated;
      rs.orders[i].price = best_bid;
    } else {
      ++stats_.rejected;
      note(s);
    }
  }
  rs.option = best;
  while (outstanding < missing) {
    Status s = Place(id, rs, best_spec, best_scope, 1, best_bid);
    note(s);
    if (!s.ok()) break;
    ++outstanding;
  }
  return first;
}

}  // namespace laissez::sdk
