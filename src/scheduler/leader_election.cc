#include "scheduler/leader_election.h"

#include "fmt/format.h"
#include "kube/object.h"
#include "spdlog/spdlog.h"

namespace dynmig::scheduler {

using nlohmann::json;

LeaderElector::LeaderElector(kube::KubeClient& client, const Clock& clock,
                             LeaderElectionOptions options)
    : client_(client), clock_(clock), options_(std::move(options)) {}

LeaderElector::~LeaderElector() { Stop(); }

void LeaderElector::OnChange(Callback callback) { callback_ = std::move(callback); }

bool LeaderElector::IsLeader() const {
  dynmig::MutexLock lock(&mu_);
  return leading_ && clock_.Now() - last_renew_ < options_.renew_deadline;
}

std::string LeaderElector::holder() const {
  dynmig::MutexLock lock(&mu_);
  return holder_;
}

void LeaderElector::SetLeading(bool leading, absl::Time renewed,
                               const std::string& previous_holder) {
  bool changed = false;
  {
    dynmig::MutexLock lock(&mu_);
    changed = leading_ != leading;
    leading_ = leading;
    if (leading) {
      last_renew_ = renewed;
      holder_ = options_.identity;
    }
  }
  if (changed) {
    spdlog::info("leader election {}/{}: {} {}", options_.lease_namespace, options_.lease_name,
                 options_.identity, leading ? "is now the leader" : "stopped leading");
    if (callback_) callback_(leading, leading ? previous_holder : "");
  }
}

bool LeaderElector::TryAcquireOrRenew() {
  dynmig::MutexLock round(&round_mu_);
  const absl::Time now = clock_.Now();
  const int64_t duration_s = std::max<int64_t>(1, absl::ToInt64Seconds(options_.lease_duration));
  auto lease = client_.GetLease(options_.lease_namespace, options_.lease_name);
  if (!lease.ok()) {
    if (lease.status().code() != absl::StatusCode::kNotFound) {
      spdlog::warn("leader election: cannot read lease {}/{}: {}", options_.lease_namespace,
                   options_.lease_name, std::string(lease.status().message()));
      if (!IsLeader()) SetLeading(false, now, "");
      return IsLeader();
    }
    json spec = {{"holderIdentity", options_.identity},
                 {"leaseDurationSeconds", duration_s},
                 {"acquireTime", kube::MicroTime(now)},
                 {"renewTime", kube::MicroTime(now)},
                 {"leaseTransitions", 0}};
    json obj = {
        {"apiVersion", "coordination.k8s.io/v1"},
        {"kind", "Lease"},
        {"metadata", {{"name", options_.lease_name}, {"namespace", options_.lease_namespace}}},
        {"spec", spec}};
    auto created = client_.CreateLease(obj);
    if (!created.ok()) {
      spdlog::info("leader election: creating lease {}/{} failed: {}", options_.lease_namespace,
                   options_.lease_name, std::string(created.status().message()));
      return IsLeader();
    }
    {
      dynmig::MutexLock lock(&mu_);
      observed_spec_ = spec;
      observed_time_ = now;
    }
    SetLeading(true, now, "");
    return IsLeader();
  }

  json spec = json::object();
  if (auto it = lease->find("spec"); it != lease->end() && it->is_object()) spec = *it;
  const std::string holder = kube::StringAt(*lease, "/spec/holderIdentity");
  int64_t lease_s = duration_s;
  if (auto it = spec.find("leaseDurationSeconds"); it != spec.end() && it->is_number_integer()) {
    lease_s = it->get<int64_t>();
  }
  absl::Time observed_at;
  {
    dynmig::MutexLock lock(&mu_);
    if (spec != observed_spec_) {
      observed_spec_ = spec;
      observed_time_ = now;
    }
    observed_at = observed_time_;
    holder_ = holder;
  }
  const bool ours = holder == options_.identity;
  if (!holder.empty() && !ours && observed_at + absl::Seconds(lease_s) > now) {
    SetLeading(false, now, "");
    return false;  // held by a live leader
  }

  json updated = *lease;
  json& s = updated["spec"];
  s["holderIdentity"] = options_.identity;
  s["leaseDurationSeconds"] = duration_s;
  s["renewTime"] = kube::MicroTime(now);
  if (!ours) {
    s["acquireTime"] = kube::MicroTime(now);
    int64_t transitions = 0;
    if (auto it = spec.find("leaseTransitions"); it != spec.end() && it->is_number_integer()) {
      transitions = it->get<int64_t>();
    }
    s["leaseTransitions"] = holder.empty() && transitions == 0 ? 0 : transitions + 1;
  }
  auto written = client_.UpdateLease(updated);
  if (!written.ok()) {
    if (written.status().code() == absl::StatusCode::kAborted) {
      // Another replica wrote the Lease since we read it: it won this round.
      SetLeading(false, now, "");
      return false;
    }
    spdlog::warn("leader election: cannot update lease {}/{}: {}", options_.lease_namespace,
                 options_.lease_name, std::string(written.status().message()));
    if (!IsLeader()) SetLeading(false, now, "");
    return IsLeader();
  }
  {
    dynmig::MutexLock lock(&mu_);
    auto it = written->find("spec");
    observed_spec_ = (it != written->end() && it->is_object()) ? *it : s;
    observed_time_ = now;
  }
  SetLeading(true, now, ours ? "" : holder);
  return IsLeader();
}

absl::Status LeaderElector::Release() {
  dynmig::MutexLock round(&round_mu_);
  {
    dynmig::MutexLock lock(&mu_);
    if (!leading_) return absl::OkStatus();
  }
  const absl::Time now = clock_.Now();
  auto lease = client_.GetLease(options_.lease_namespace, options_.lease_name);
  absl::Status status = lease.status();
  if (lease.ok() && kube::StringAt(*lease, "/spec/holderIdentity") == options_.identity) {
    json updated = *lease;
    updated["spec"]["holderIdentity"] = "";
    updated["spec"]["leaseDurationSeconds"] = 1;
    updated["spec"]["renewTime"] = kube::MicroTime(now);
    status = client_.UpdateLease(updated).status();
  }
  SetLeading(false, now, "");
  return status;
}

void LeaderElector::Start() {
  dynmig::MutexLock lock(&loop_mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] {
    dynmig::MutexLock l(&loop_mu_);
    while (!stopping_) {
      loop_mu_.Unlock();
      TryAcquireOrRenew();
      loop_mu_.Lock();
      clock_.WaitFor(loop_cv_, loop_mu_, options_.retry_period,
                     [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_mu_) { return stopping_; });
    }
  });
}

void LeaderElector::Stop() {
  std::thread thread;
  {
    dynmig::MutexLock lock(&loop_mu_);
    stopping_ = true;
    thread = std::move(thread_);
  }
  loop_cv_.SignalAll();
  if (thread.joinable()) thread.join();
  absl::Status st = Release();
  if (!st.ok()) {
    spdlog::warn("leader election: releasing lease {}/{} failed: {}", options_.lease_namespace,
                 options_.lease_name, std::string(st.message()));
  }
}

}  // namespace dynmig::scheduler
