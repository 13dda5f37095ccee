#include <fmt/format.h>

#include <cerrno>
#include <cstring>

#include "redis_connection.hpp"

#if TIER_REDIS_TLS
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include "redis_tls.hpp"
#endif

namespace tier::redis {

#if TIER_REDIS_TLS

bool tls_available() noexcept { return true; }

namespace {
// A file option names a regular file (opening a FIFO or a device would block or act), a path
// option an existing directory: checked here, when the tier opens, not at the first handshake.
Status check_path(const char* option, const std::string& path, bool directory) {
  if (path.empty()) return Status::ok();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return Status::invalid(fmt::format("{}: \"{}\": {}", option, path, std::strerror(errno)));
  if (directory ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))
    return Status::invalid(fmt::format("{}: \"{}\" is not a {}", option, path,
                                       directory ? "directory" : "regular file"));
  return Status::ok();
}
}  // namespace

Result<std::shared_ptr<TlsContext>> make_tls_context(const TlsConfig& cfg) {
  namespace ssl = boost::asio::ssl;
  TIER_RETURN_IF_ERROR(check_path("tls_ca_file", cfg.ca_file, false));
  TIER_RETURN_IF_ERROR(check_path("tls_ca_path", cfg.ca_path, true));
  TIER_RETURN_IF_ERROR(check_path("tls_cert_file", cfg.cert_file, false));
  TIER_RETURN_IF_ERROR(check_path("tls_key_file", cfg.key_file, false));
  boost::system::error_code ec;
  auto tls = std::make_shared<TlsContext>(cfg);
  SSL_CTX_set_min_proto_version(tls->ctx.native_handle(), TLS1_2_VERSION);
  if (cfg.verify) {
    tls->ctx.set_verify_mode(ssl::verify_peer, ec);
    if (cfg.ca_file.empty() && cfg.ca_path.empty()) {
      if (tls->ctx.set_default_verify_paths(ec); ec)
        return Status::invalid(
            fmt::format("tls_ca_file: none given and no system trust store: {}", ec.message()));
    }
    if (!cfg.ca_file.empty() && (tls->ctx.load_verify_file(cfg.ca_file, ec), ec))
      return Status::invalid(
          fmt::format("tls_ca_file: cannot load \"{}\": {}", cfg.ca_file, ec.message()));
    if (!cfg.ca_path.empty() && (tls->ctx.add_verify_path(cfg.ca_path, ec), ec))
      return Status::invalid(
          fmt::format("tls_ca_path: cannot use \"{}\": {}", cfg.ca_path, ec.message()));
  } else {
    tls->ctx.set_verify_mode(ssl::verify_none, ec);
  }
  if (!cfg.cert_file.empty()) {
    if (tls->ctx.use_certificate_chain_file(cfg.cert_file, ec); ec)
      return Status::invalid(
          fmt::format("tls_cert_file: cannot load \"{}\": {}", cfg.cert_file, ec.message()));
    if (tls->ctx.use_private_key_file(cfg.key_file, ssl::context::pem, ec); ec)
      return Status::invalid(
          fmt::format("tls_key_file: cannot load \"{}\": {}", cfg.key_file, ec.message()));
    if (SSL_CTX_check_private_key(tls->ctx.native_handle()) != 1)
      return Status::invalid(fmt::format("tls_key_file: \"{}\" is not the key of \"{}\"",
                                         cfg.key_file, cfg.cert_file));
  }
  return tls;
}

Status prepare_tls_stream(TlsStream& s, const TlsConfig& cfg, const std::string& host) {
  SSL* ssl = s.stream.native_handle();
  const std::string& name = cfg.server_name.empty() ? host : cfg.server_name;
  boost::system::error_code ec;
  boost::asio::ip::make_address(name, ec);
  const bool is_ip = !ec;
  // SNI carries host names only (RFC 6066); an address is verified against the IP SANs.
  if (!is_ip && SSL_set_tlsext_host_name(ssl, name.c_str()) != 1)
    return Status::io_error(fmt::format("TLS: cannot send \"{}\" as SNI", name));
  if (cfg.verify) {
    int ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name.c_str())
                   : SSL_set1_host(ssl, name.c_str());
    if (ok != 1) return Status::io_error(fmt::format("TLS: cannot verify the name \"{}\"", name));
  }
  return Status::ok();
}

std::string tls_handshake_error(TlsStream& s, const boost::system::error_code& ec) {
  long v = SSL_get_verify_result(s.stream.native_handle());
  if (v == X509_V_OK) return ec.message();
  return fmt::format("{}: {}", ec.message(), X509_verify_cert_error_string(v));
}

#else

bool tls_available() noexcept { return false; }

Result<std::shared_ptr<TlsContext>> make_tls_context(const TlsConfig&) {
  return Status(Code::kNotSupported, "rediss:// (TLS) needs libtier built with OpenSSL");
}

#endif

}  // namespace tier::redis
