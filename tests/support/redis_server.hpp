#pragma once
// Real redis-server processes for the remote tier's tests: spawned on 127.0.0.1 on free ports in
// their own temporary directories, killed, paused and restarted on the same port, and stopped when
// the object goes away. RedisCluster makes a 3-master Redis Cluster with
// `redis-cli --cluster create`. Nothing listens beyond loopback; nothing is persisted.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace tier::test {

// True when `name` is an executable on PATH.
inline bool have_program(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  std::string p(path);
  for (std::size_t start = 0; start <= p.size();) {
    std::size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string file = p.substr(start, end - start) + "/" + name;
    if (::access(file.c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

inline sockaddr_in loopback(std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

inline bool port_free(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a = loopback(port);
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// A free loopback port; with `cluster_bus`, port + 10000 is free as well. Both lie below Linux's
// default ephemeral range (32768-60999), from which any client's outgoing connection may take a
// port between this check and the server's bind.
inline std::uint16_t free_port(bool cluster_bus = false) {
  static std::mt19937 rng{std::random_device{}()};
  std::uniform_int_distribution<int> dist(12000, 22000);
  for (int i = 0; i < 1000; ++i) {
    auto p = static_cast<std::uint16_t>(dist(rng));
    if (port_free(p) && (!cluster_bus || port_free(static_cast<std::uint16_t>(p + 10000))))
      return p;
  }
  return 0;
}

// Runs a shell command line and returns its standard output.
inline std::string shell(const std::string& cmd) {
  std::string out;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  ::pclose(f);
  return out;
}

// Sends "PING" over a plain socket; true on any reply (+PONG, or -NOAUTH from a server with a
// password: it answers either way).
inline bool ping(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a = loopback(port);
  timeval tv{0, 200'000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::write(fd, "PING\r\n", 6) == 6) {
    char c;
    ok = ::read(fd, &c, 1) == 1;
  }
  ::close(fd);
  return ok;
}

// Forks `redis-server args...` and waits (up to 5 s, polling) until `ready()` holds. Returns the
// child's pid, or -1 when it could not start or exited first.
template <class Ready>
pid_t spawn_redis_server(std::vector<std::string> args, Ready&& ready) {
  pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp("redis-server", argv.data());
    ::_exit(127);
  }
  if (pid < 0) return -1;
  for (int i = 0; i < 500; ++i) {
    if (ready()) return pid;
    int st;
    if (::waitpid(pid, &st, WNOHANG) == pid) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pid;  // still starting: the caller's first request will tell
}

class RedisServer {
 public:
  // `extra` are further redis-server arguments ("--requirepass", "pw", ...). Port 0: a free one.
  explicit RedisServer(std::vector<std::string> extra = {}, std::uint16_t port = 0,
                       bool cluster_bus = false)
      : extra_(std::move(extra)),
        port_(port != 0 ? port : free_port(cluster_bus)),
        chosen_port_(port == 0),
        cluster_bus_(cluster_bus) {
    char tmpl[] = "/tmp/libtier-redis-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) dir_ = tmpl;
  }
  ~RedisServer() {
    kill();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  std::uint16_t port() const {
    handed_out_ = true;
    return port_;
  }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port()); }
  bool running() const { return pid_ > 0; }

  // Spawns the server and waits (up to 5 s) until it answers. The data set starts empty. A first
  // start on a port this class chose, and nobody was told yet (port(), url()), moves to another
  // free port when the server cannot start (another process took the port since it was found
  // free), up to 3 times.
  bool start() {
    if (pid_ > 0) return true;
    for (int attempt = 0;; ++attempt) {
      std::vector<std::string> args = {
          "redis-server", "--port",    std::to_string(port_), "--bind", "127.0.0.1",
          "--save",       "",          "--appendonly",        "no",     "--dir",
          dir_,           "--logfile", dir_ + "/redis.log"};
      args.insert(args.end(), extra_.begin(), extra_.end());
      pid_ = spawn_redis_server(std::move(args), [&] { return ping(port_); });
      if (pid_ > 0 && ping(port_)) {
        started_ = true;
        return true;
      }
      kill();
      if (started_ || handed_out_ || !chosen_port_ || attempt == 3) return false;
      port_ = free_port(cluster_bus_);
    }
  }
  // SIGKILL: the server dies at once, as in a crash; the port closes.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGKILL);
    int st;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
  }
  // SIGSTOP / SIGCONT: a server that accepts connections but does not answer (a slow server).
  void pause() {
    if (pid_ > 0) ::kill(pid_, SIGSTOP);
  }
  void resume() {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
  }
  // redis-cli against this server; `args` is a shell-quoted argument string.
  std::string cli(const std::string& args) const {
    return shell("redis-cli -p " + std::to_string(port_) + " " + args + " 2>/dev/null");
  }

 private:
  std::vector<std::string> extra_;
  std::uint16_t port_;
  bool chosen_port_;   // port_ was found free here, not given by the test
  bool cluster_bus_;   // port_ + 10000 must be free too
  bool started_ = false;
  mutable bool handed_out_ = false;
  std::string dir_;
  pid_t pid_ = -1;
};

// Three masters, no replicas, all slots assigned (cluster_state:ok) once start() returns true.
class RedisCluster {
 public:
  RedisCluster() {
    for (int i = 0; i < 3; ++i)
      nodes_.push_back(std::make_unique<RedisServer>(
          std::vector<std::string>{"--cluster-enabled", "yes", "--cluster-config-file",
                                   "nodes.conf", "--cluster-node-timeout", "5000"},
          0, true));
  }
  bool start() {
    std::string addrs;
    for (auto& n : nodes_) {
      if (!n->start()) return false;
      addrs += " 127.0.0.1:" + std::to_string(n->port());
    }
    shell("redis-cli --cluster create" + addrs +
          " --cluster-replicas 0 --cluster-yes >/dev/null 2>&1");
    for (int i = 0; i < 500; ++i) {
      bool ok = true;
      for (auto& n : nodes_)
        ok = ok && n->cli("cluster info").find("cluster_state:ok") != std::string::npos;
      if (ok) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  RedisServer& node(std::size_t i) { return *nodes_.at(i); }
  std::size_t size() const { return nodes_.size(); }
  std::string node_id(std::size_t i) {
    std::string id = node(i).cli("cluster myid");
    while (!id.empty() && (id.back() == '\n' || id.back() == '\r')) id.pop_back();
    return id;
  }

 private:
  std::vector<std::unique_ptr<RedisServer>> nodes_;
};

}  // namespace tier::test
