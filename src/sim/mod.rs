//! A CloudStack API simulator that behaves like CKS (Alert rules included). Test fixture,
//! kept separate from the provider: it shares no decision logic with it.
