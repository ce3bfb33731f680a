//! A test client of divvy's Rate Limit Quota Service.

use std::net::SocketAddr;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tokio::sync::mpsc;

/// Opens a `StreamRateLimitQuotas` stream to divvy's gRPC port: the sender
/// of its reports (the stream ends when it is dropped) and its answers.
pub async fn open_stream(
    grpc: SocketAddr,
) -> (
    mpsc::Sender<RateLimitQuotaUsageReports>,
    tonic::Streaming<RateLimitQuotaResponse>,
) {
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect");
    let (tx, rx) = mpsc::channel(4);
    let answers = client
        .stream_rate_limit_quotas(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();
    (tx, answers)
}

/// One bucket's usage over the last second: bucket `{key: value}`.
pub fn usage(key: &str, value: &str, allowed: u64, denied: u64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: [(key.to_owned(), value.to_owned())].into(),
        }),
        time_elapsed: Some(PbDuration {
            seconds: 1,
            nanos: 0,
        }),
        num_requests_allowed: allowed,
        num_requests_denied: denied,
    }
}
