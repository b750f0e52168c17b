//! Server reflection (v1 and v1alpha) lists every service and describes them,
//! so grpcurl works with no proto files.

use crate::helpers::spawn_app;
use tonic_reflection::pb::{v1, v1alpha};

const EXPECTED: [&str; 3] = [
    "auth.v1.AuthService",
    "envoy.service.auth.v3.Authorization",
    "grpc.health.v1.Health",
];

#[tokio::test]
async fn v1alpha_lists_and_describes_the_services() {
    use v1alpha::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let app = spawn_app().await;
    let mut client = ServerReflectionClient::new(app.channel().await);
    let requests = [
        MessageRequest::ListServices(String::new()),
        MessageRequest::FileContainingSymbol("auth.v1.AuthService".into()),
        MessageRequest::FileContainingSymbol("google.rpc.BadRequest".into()),
        MessageRequest::FileContainingSymbol("envoy.service.auth.v3.Authorization".into()),
    ]
    .map(|m| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(m),
    });
    let mut responses = client
        .server_reflection_info(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner();
    let mut answers = Vec::new();
    while let Some(r) = responses.message().await.unwrap() {
        answers.push(r.message_response.expect("a response"));
    }
    let MessageResponse::ListServicesResponse(list) = &answers[0] else {
        panic!("{:?}", answers[0]);
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    for expected in EXPECTED {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    for answer in &answers[1..] {
        let MessageResponse::FileDescriptorResponse(files) = answer else {
            panic!("{answer:?}");
        };
        assert!(!files.file_descriptor_proto.is_empty());
    }
}

#[tokio::test]
async fn v1_lists_the_services() {
    use v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let app = spawn_app().await;
    let mut client = ServerReflectionClient::new(app.channel().await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let answer = responses.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("{answer:?}");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    for expected in EXPECTED {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
}
