//! The second factor as the binary runs it: its audit events (enrollment, codes
//! accepted and refused, each recovery code used, the factor turned off), and no
//! secret anywhere in the log (the TOTP secret, codes, recovery codes, the
//! challenge, the data key), nor in `--help`. The server's own clock: codes are
//! computed for the time now, one step ahead where one was used before.

use crate::{
    cli::spawn_authd,
    helpers::{TEST_KEY, TEST_KID, authd_command, key_spec},
    totp::{K1, base32_decode, code_at},
};
use authd::pb::{
    BeginTotpEnrollmentRequest, CompleteLoginRequest, ConfirmTotpEnrollmentRequest,
    DisableTotpRequest, LoginRequest, RegisterRequest,
};
use std::time::{SystemTime, UNIX_EPOCH};

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test]
async fn the_audit_trail_tells_every_second_factor_outcome_and_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let running = spawn_authd(
        dir.path(),
        &[
            ("AUTHD_TOKEN_KEYS", key_spec(TEST_KID, TEST_KEY)),
            ("AUTHD_DATA_KEYS", K1.into()),
        ],
    );
    let mut client = running.client().await;
    let password = "a fine password";
    let register = RegisterRequest {
        username: "agnes".into(),
        password: password.into(),
    };
    let user_id = client
        .register(register)
        .await
        .unwrap()
        .into_inner()
        .user_id;
    let login = LoginRequest {
        username: "agnes".into(),
        password: password.into(),
    };
    let token = (client.login(login.clone()).await.unwrap().into_inner()).access_token;
    let begun = (client.begin_totp_enrollment(BeginTotpEnrollmentRequest {
        access_token: token.clone(),
    }))
    .await
    .unwrap()
    .into_inner();
    let secret = base32_decode(&begun.secret);
    let confirmed = code_at(&secret, now());
    let recovery = (client.confirm_totp_enrollment(ConfirmTotpEnrollmentRequest {
        access_token: token.clone(),
        code: confirmed.clone(),
    }))
    .await
    .unwrap()
    .into_inner()
    .recovery_codes;
    let challenge = (client.login(login.clone()).await.unwrap().into_inner()).challenge;
    let complete = |code: &str| CompleteLoginRequest {
        challenge: challenge.clone(),
        code: code.into(),
    };
    // The confirmation's code again: used.
    let reused = client.complete_login(complete(&confirmed)).await;
    assert_eq!(reused.unwrap_err().code(), tonic::Code::Unauthenticated);
    let ahead = code_at(&secret, now() + 30);
    let session = (client.complete_login(complete(&ahead)).await.unwrap()).into_inner();
    let challenge = (client.login(login.clone()).await.unwrap().into_inner()).challenge;
    let by_recovery = CompleteLoginRequest {
        challenge: challenge.clone(),
        code: recovery[0].clone(),
    };
    client.complete_login(by_recovery).await.unwrap();
    let disable = DisableTotpRequest {
        access_token: session.access_token.clone(),
        code: recovery[1].clone(),
    };
    client.disable_totp(disable).await.unwrap();

    let (status, log) = running.terminate().await;
    assert!(status.success());
    let events: Vec<serde_json::Value> = (log.iter())
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["target"] == "authd::audit")
        .collect();
    let find = |event: &str, outcome: &str| -> Vec<&serde_json::Value> {
        (events.iter())
            .filter(|e| e["event"] == event && e["outcome"] == outcome)
            .collect()
    };
    for change in ["enrollment_begun", "enrolled", "disabled"] {
        let found = find("second_factor", change);
        assert_eq!(found.len(), 1, "{change}: {events:?}");
        assert_eq!(found[0]["user_id"], user_id.as_str());
    }
    assert_eq!(find("login", "second_factor_required").len(), 2);
    let ok = find("second_factor_code", "ok");
    let kinds: Vec<(&str, &str)> = (ok.iter())
        .map(|e| (e["kind"].as_str().unwrap(), e["purpose"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("totp", "confirm"),
            ("totp", "login"),
            ("recovery", "login"),
            ("recovery", "disable")
        ]
    );
    let reused = find("second_factor_code", "reused");
    assert_eq!(reused.len(), 1);
    assert_eq!(reused[0]["user_id"], user_id.as_str());
    // Logins with the factor succeed as logins.
    assert_eq!(find("login", "ok").len(), 3);

    let all = log.join("\n");
    let key = K1.split_once(':').unwrap().1;
    let mut secrets = vec![
        begun.secret.clone(),
        begun.secret.to_lowercase(),
        confirmed,
        ahead,
        challenge,
        key.to_owned(),
        session.access_token,
    ];
    secrets.extend(recovery.iter().cloned());
    secrets.extend(recovery.iter().map(|c| c.replace('-', "")));
    for secret in secrets {
        assert!(!all.contains(&secret), "{secret} was logged:\n{all}");
    }

    // --help names the option, never its value.
    let help = authd_command()
        .arg("--help")
        .env("AUTHD_DATA_KEYS", K1)
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    assert!(
        help.contains("AUTHD_DATA_KEYS") && !help.contains(key),
        "{help}"
    );
}
