//! Building the aws-sdk-s3 client from a resolved configuration.

use std::sync::Arc;
use std::time::Duration;

use aws_config::meta::credentials::CredentialsProviderChain;
use aws_config::meta::region::RegionProviderChain;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_credential_types::provider::error::CredentialsError;
use aws_sdk_s3::config::{
    Credentials, ProvideCredentials, RequestChecksumCalculation, ResponseChecksumValidation,
    SharedCredentialsProvider,
};
use aws_sdk_s3::Client;
use aws_smithy_http_client::tls;

use super::config::{CredentialSource, Resolved};
use crate::error::{Error, ErrorKind, Result};

/// Connections are cheap to open on a LAN and slow ones should fail over to
/// a retry, not hang a load.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// EC2's metadata service is only probed on EC2: elsewhere the probe costs
/// seconds of timeouts and sends traffic to an address nobody asked for.
fn on_ec2() -> bool {
    [
        "/sys/devices/virtual/dmi/id/board_vendor",
        "/sys/devices/virtual/dmi/id/sys_vendor",
    ]
    .iter()
    .filter_map(|p| std::fs::read_to_string(p).ok())
    .any(|v| v.contains("Amazon"))
}

fn aws_chain(profile: Option<&str>) -> CredentialsProviderChain {
    let mut profile_provider = aws_config::profile::ProfileFileCredentialsProvider::builder();
    if let Some(p) = profile {
        profile_provider = profile_provider.profile_name(p);
    }
    let chain = CredentialsProviderChain::first_try(
        "Environment",
        aws_config::environment::EnvironmentVariableCredentialsProvider::new(),
    )
    .or_else("Profile", profile_provider.build())
    .or_else(
        "WebIdentityToken",
        aws_config::web_identity_token::WebIdentityTokenCredentialsProvider::builder().build(),
    )
    .or_else(
        "EcsContainer",
        aws_config::ecs::EcsCredentialsProvider::builder().build(),
    );
    let imds_disabled =
        std::env::var("AWS_EC2_METADATA_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    if !imds_disabled && on_ec2() {
        chain.or_else(
            "Ec2InstanceMetadata",
            aws_config::imds::credentials::ImdsCredentialsProvider::builder().build(),
        )
    } else {
        chain
    }
}

/// Explicit or environment region, then the profile's, then (on EC2 only)
/// the instance's, then `us-east-1`.
async fn resolve_region(res: &Resolved) -> Region {
    if let Some(region) = &res.region {
        return Region::new(region.clone());
    }
    let mut profile = aws_config::profile::ProfileFileRegionProvider::builder();
    if let Some(p) = &res.profile {
        profile = profile.profile_name(p);
    }
    let mut chain = RegionProviderChain::first_try(
        aws_config::environment::region::EnvironmentVariableRegionProvider::new(),
    )
    .or_else(profile.build());
    if on_ec2() && !imds_disabled() {
        chain = chain.or_else(aws_config::imds::region::ImdsRegionProvider::builder().build());
    }
    chain
        .region()
        .await
        .unwrap_or_else(|| Region::new("us-east-1"))
}

fn imds_disabled() -> bool {
    std::env::var("AWS_EC2_METADATA_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
}

/// A client and the credential source it ended up using (named in auth
/// errors; the secret never is).
#[derive(Clone, Debug)]
pub struct S3Client {
    pub client: Client,
    pub creds: CredentialSource,
    /// Where requests go, as errors name it: the endpoint URL given, or
    /// AWS's endpoint of the region.
    pub endpoint: Arc<str>,
}

/// The AWS chain, resolved now, so that "no credentials anywhere" falls
/// back to anonymous access (public buckets) as tensorizer does: `None`.
/// A source that is set up but fails (a credential_process that exits with
/// an error, an expired SSO session) and a profile asked for by name that
/// no AWS config file defines are the user's errors to see (boto3 says
/// "profile not found" too), not reasons to send unsigned requests.
async fn aws_chain_credentials(res: &Resolved) -> Result<Option<CredentialsProviderChain>> {
    let chain = aws_chain(res.profile.as_deref());
    let auth = |what: String| Err(Error::new(ErrorKind::Auth, what));
    match chain.provide_credentials().await {
        Ok(_) => Ok(Some(chain)),
        Err(CredentialsError::CredentialsNotLoaded(_)) => match res.profile.as_deref() {
            Some(name) if name != "default" && !profile_defined(name).await => auth(format!(
                "AWS profile \"{name}\" is not defined in the AWS config or credentials file"
            )),
            _ => Ok(None),
        },
        Err(e) => auth(format!(
            "could not get credentials from {}: {}",
            CredentialSource::AwsChain.describe(),
            crate::error::causes(&e)
        )),
    }
}

/// Whether the AWS config files define profile `name`, as the SDK reads
/// them (`AWS_CONFIG_FILE` and `AWS_SHARED_CREDENTIALS_FILE` honoured).
/// Files that cannot be read or parsed leave the verdict to the SDK.
async fn profile_defined(name: &str) -> bool {
    use aws_runtime::env_config::file::EnvConfigFiles;
    use aws_types::os_shim_internal::{Env, Fs};
    let files = EnvConfigFiles::default();
    match aws_config::profile::load(&Fs::real(), &Env::real(), &files, None).await {
        Ok(profiles) => profiles.get_profile(name).is_some(),
        Err(_) => true,
    }
}

/// The client and which credential source it ended up using.
pub async fn build_client(res: &Resolved) -> Result<S3Client> {
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .read_timeout(READ_TIMEOUT)
                .build(),
        );
    // Always our own region chain: the SDK's default one ends with a
    // metadata-service probe, which off EC2 costs seconds and sends traffic
    // nobody asked for.
    loader = loader.region(resolve_region(res).await);
    if let Some(profile) = &res.profile {
        loader = loader.profile_name(profile);
    }
    if let Some(endpoint) = &res.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    // The SDK's own client, but with names resolved once for all the
    // connections of a load (crate::io::dns) and any extra trusted CAs.
    let mut http = aws_smithy_http_client::Builder::new().tls_provider(tls::Provider::Rustls(
        tls::rustls_provider::CryptoMode::AwsLc,
    ));
    if let Some(ca) = &res.ca_bundle {
        let pem = crate::io::tls::read_ca_bundle(ca)?;
        let ctx = tls::TlsContext::builder()
            .with_trust_store(tls::TrustStore::default().with_pem_certificate(pem))
            .build()
            .map_err(|e| Error::invalid(format!("bad CA bundle: {e}")))?;
        http = http.tls_context(ctx);
    }
    loader = loader.http_client(http.build_with_resolver(crate::io::dns::CachedDns::new()));
    let mut source = res.source;
    loader = match (&res.keys, res.source) {
        (Some(k), _) => loader.credentials_provider(Credentials::new(
            k.access_key_id.clone(),
            k.secret_access_key.clone(),
            k.session_token.clone(),
            None,
            "fastshard",
        )),
        (None, CredentialSource::AwsChain) => match aws_chain_credentials(res).await? {
            Some(chain) => loader.credentials_provider(SharedCredentialsProvider::new(chain)),
            None => {
                source = CredentialSource::Anonymous;
                loader.no_credentials()
            }
        },
        (None, _) => loader.no_credentials(),
    };
    let sdk = loader.load().await;
    let endpoint: Arc<str> = match (&res.endpoint, sdk.region()) {
        (Some(url), _) => url.as_str().into(),
        (None, Some(region)) => format!("AWS S3 in {region}").into(),
        (None, None) => "AWS S3".into(),
    };
    let conf = aws_sdk_s3::config::Builder::from(&sdk)
        .force_path_style(res.force_path_style)
        // S3-compatible stores mishandle the SDK's default checksums; ranged
        // GETs cannot be validated against whole-object checksums anyway.
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
    Ok(S3Client {
        client: Client::from_conf(conf.build()),
        creds: source,
        endpoint,
    })
}
