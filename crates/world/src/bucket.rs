//! Creating the blob store's S3 bucket, for a first deployment.
//!
//! `object_store` reads and writes objects but cannot make a bucket, and a fresh
//! compose stack or test store has none. `steadfast migrate --create-bucket` makes it
//! with one signed `PUT /<bucket>` (SigV4 by `object_store`'s own signer, with the
//! same `AWS_*` settings the store uses), so a deployment needs no second tool such
//! as `mc` or the AWS CLI. A bucket that is already there, and ours, is fine.

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, AwsAuthorizer};
use object_store::client::{ClientOptions, HttpClient, HttpConnector, ReqwestConnector};

use crate::{Error, Result};

/// What [`create_bucket`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketMade {
    /// The bucket did not exist and was made.
    Created,
    /// The bucket was there already (owned by these credentials).
    AlreadyThere,
    /// The blob store is a local directory: there is no bucket to make.
    NotABucket,
}

/// Makes the bucket a blob store URL (`s3://bucket/prefix`) names, if it is missing.
pub async fn create_bucket(url: &str) -> Result<BucketMade> {
    let Some(rest) = url.strip_prefix("s3://") else {
        return Ok(BucketMade::NotABucket);
    };
    let bucket = rest.split('/').next().unwrap_or_default();
    if bucket.is_empty() {
        return Err(Error::blob_says(format!("no bucket in {url}")));
    }
    let builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
    let region = builder
        .get_config_value(&AmazonS3ConfigKey::Region)
        .unwrap_or_else(|| "us-east-1".into());
    let endpoint = builder.get_config_value(&AmazonS3ConfigKey::Endpoint);
    let store = builder
        .build()
        .map_err(|e| Error::blob_in(url.to_string(), e))?;
    let credential = store
        .credentials()
        .get_credential()
        .await
        .map_err(|e| Error::blob_in(format!("{url}: no credentials"), e))?;
    let target = match &endpoint {
        Some(endpoint) => format!("{}/{bucket}", endpoint.trim_end_matches('/')),
        None => format!("https://{bucket}.s3.{region}.amazonaws.com/"),
    };
    // Outside us-east-1, AWS wants the region named in the body.
    let body = if region == "us-east-1" {
        String::new()
    } else {
        format!(
            "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
             <LocationConstraint>{region}</LocationConstraint></CreateBucketConfiguration>"
        )
    };
    let client: HttpClient = ReqwestConnector::default()
        .connect(&ClientOptions::new().with_allow_http(target.starts_with("http://")))
        .map_err(Error::blob)?;
    let authorizer = AwsAuthorizer::new(&credential, "s3", &region);
    // Some stores answer a PUT of a bucket one already owns with 200, so ask first.
    let (status, _) = send(
        &client,
        &authorizer,
        &target,
        http::Method::HEAD,
        String::new(),
    )
    .await?;
    if status.is_success() {
        return Ok(BucketMade::AlreadyThere);
    }
    let (status, said) = send(&client, &authorizer, &target, http::Method::PUT, body).await?;
    if status.is_success() {
        Ok(BucketMade::Created)
    } else if said.contains("BucketAlreadyOwnedByYou") {
        Ok(BucketMade::AlreadyThere)
    } else {
        Err(Error::blob_says(format!(
            "creating the bucket at {target}: {status}: {said}"
        )))
    }
}

/// Sends one signed request to the bucket's URL; its status and what it said.
async fn send(
    client: &HttpClient,
    authorizer: &AwsAuthorizer<'_>,
    target: &str,
    method: http::Method,
    body: String,
) -> Result<(http::StatusCode, String)> {
    let mut request = object_store::client::HttpRequest::new(body.into());
    *request.method_mut() = method;
    *request.uri_mut() = target
        .parse()
        .map_err(|e| Error::blob_in(target.to_string(), e))?;
    authorizer.authorize(&mut request, None);
    let response = client
        .execute(request)
        .await
        .map_err(|e| Error::blob_in(format!("creating the bucket at {target}"), e))?;
    let status = response.status();
    let said = response.into_body().bytes().await.unwrap_or_default();
    Ok((status, String::from_utf8_lossy(&said).trim().to_string()))
}
