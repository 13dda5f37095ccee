#pragma once
// TLS fixtures for the remote tier's tests: a test CA and certificates made at test time with the
// `openssl` command (a valid chain, a second CA, an expired certificate, a certificate for
// another name, a client certificate), and redis-server started with TLS only (--port 0
// --tls-port P) on loopback, in the style of redis_server.hpp.

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/redis_server.hpp"

namespace tier::test {

// A directory of test certificates, removed with the object. ok() is false when a command failed.
class TestPki {
 public:
  TestPki() {
    char tmpl[] = "/tmp/libtier-pki-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return;
    dir_ = tmpl;
    ok_ = make_ca("ca") && make_ca("other-ca") &&
          make_cert("server", "ca", "DNS:localhost,IP:127.0.0.1", false) &&
          make_cert("expired", "ca", "DNS:localhost,IP:127.0.0.1", true) &&
          make_cert("elsewhere", "ca", "DNS:other.example", false) &&
          make_cert("client", "ca", "DNS:libtier-client", false);
    if (ok_) {
      // A CA directory in OpenSSL's hashed layout, for tls_ca_path.
      std::filesystem::create_directory(dir_ + "/cadir");
      std::filesystem::copy_file(dir_ + "/ca.crt", dir_ + "/cadir/ca.pem");
      ok_ = run("openssl rehash " + dir_ + "/cadir");
    }
  }
  ~TestPki() {
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  TestPki(const TestPki&) = delete;
  TestPki& operator=(const TestPki&) = delete;

  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  // "<dir>/<name>.crt" or ".key"
  std::string crt(const std::string& name) const { return dir_ + "/" + name + ".crt"; }
  std::string key(const std::string& name) const { return dir_ + "/" + name + ".key"; }
  std::string ca_dir() const { return dir_ + "/cadir"; }

 private:
  bool run(const std::string& cmd) {
    std::string out = shell("cd " + dir_ + " && " + cmd + " 2>&1; echo \"exit=$?\"");
    if (out.ends_with("exit=0\n")) return true;
    error_ = cmd + ": " + out;
    return false;
  }
  bool make_ca(const std::string& name) {
    return run(
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " +
        name + ".key -out " + name + ".crt -days 2 -subj /CN=libtier-test-" + name);
  }
  // A key and a certificate signed by `ca` for `san`; `expired`: valid in 2020 only (openssl 3.0's
  // x509 cannot set a start date: `openssl ca` with -startdate/-enddate can).
  bool make_cert(const std::string& name, const std::string& ca, const std::string& san,
                 bool expired) {
    std::ofstream(dir_ + "/" + name + ".ext") << "subjectAltName=" << san << "\n";
    if (!run("openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " +
             name + ".key -out " + name + ".csr -subj /CN=" + name))
      return false;
    if (!expired)
      return run("openssl x509 -req -in " + name + ".csr -CA " + ca + ".crt -CAkey " + ca +
                 ".key -CAcreateserial -days 2 -extfile " + name + ".ext -out " + name + ".crt");
    std::ofstream(dir_ + "/index.txt").close();
    std::ofstream(dir_ + "/serial") << "1000\n";
    std::ofstream(dir_ + "/ca.cnf") << "[ca]\ndefault_ca = d\n[d]\ndir = " << dir_
                                    << "\ndatabase = $dir/index.txt\nnew_certs_dir = $dir\n"
                                       "serial = $dir/serial\ndefault_md = sha256\n"
                                       "policy = p\n[p]\ncommonName = supplied\n";
    return run("openssl ca -batch -notext -config ca.cnf -cert " + ca + ".crt -keyfile " + ca +
               ".key -in " + name + ".csr -out " + name + ".crt -extfile " + name +
               ".ext -startdate 20200101000000Z -enddate 20200102000000Z");
  }

  std::string dir_;
  std::string error_;
  bool ok_ = false;
};

// True when something accepts TCP connections on the loopback port.
inline bool accepts(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a = loopback(port);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// redis-server with TLS only, serving `cert` (and its key) signed by the PKI's CA; with
// `client_certs`, clients must present a certificate signed by that CA.
class TlsRedisServer {
 public:
  TlsRedisServer(const TestPki& pki, const std::string& cert, bool client_certs)
      : port_(free_port()) {
    char tmpl[] = "/tmp/libtier-redis-tls-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) dir_ = tmpl;
    args_ = {"redis-server",
             "--port",
             "0",
             "--tls-port",
             std::to_string(port_),
             "--bind",
             "127.0.0.1",
             "--save",
             "",
             "--appendonly",
             "no",
             "--dir",
             dir_,
             "--logfile",
             dir_ + "/redis.log",
             "--tls-cert-file",
             pki.crt(cert),
             "--tls-key-file",
             pki.key(cert),
             "--tls-ca-cert-file",
             pki.crt("ca"),
             "--tls-auth-clients",
             client_certs ? "yes" : "no"};
  }
  ~TlsRedisServer() {
    kill();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  TlsRedisServer(const TlsRedisServer&) = delete;
  TlsRedisServer& operator=(const TlsRedisServer&) = delete;

  std::uint16_t port() const { return port_; }
  std::string url(const std::string& host = "127.0.0.1") const {
    return "rediss://" + host + ":" + std::to_string(port_);
  }
  // Spawns the server and waits (up to 5 s) until it accepts connections.
  bool start() {
    if (pid_ > 0) return true;
    pid_ = spawn_redis_server(args_, [&] { return accepts(port_); });
    return pid_ > 0 && accepts(port_);
  }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int st;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
  }
  std::string log() const { return shell("cat " + dir_ + "/redis.log 2>/dev/null"); }

 private:
  std::uint16_t port_;
  std::string dir_;
  std::vector<std::string> args_;
  pid_t pid_ = -1;
};

}  // namespace tier::test
