//! What each provider family supports: the one capability list, read by ingress routing
//! (`strategy.rs`, to filter targets) and by the workers' adapters (`Provider::capabilities`).

use crate::config::ProviderKind;

/// What a provider family supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Server-sent-event streaming.
    pub streaming: bool,
    /// Function/tool calling.
    pub tools: bool,
    /// Image inputs.
    pub vision: bool,
    /// `response_format` JSON mode.
    pub json_mode: bool,
    /// An embeddings endpoint.
    pub embeddings: bool,
    /// Several choices in one call (OpenAI `n > 1`): the upstream samples them and bills the
    /// prompt once. Only the OpenAI-style Chat Completions APIs (a Responses-API target has none).
    pub choices: bool,
}

impl Capabilities {
    /// The static capability table per provider family.
    pub const fn of(kind: ProviderKind) -> Self {
        let (json_mode, embeddings) = match kind {
            ProviderKind::Openai | ProviderKind::OpenaiCompatible => (true, true),
            // Anthropic: JSON through a synthetic tool (workers' `anthropic::structured`).
            // Azure has an embeddings endpoint; its adapter does not implement `embed` yet.
            ProviderKind::AzureOpenai | ProviderKind::Gemini | ProviderKind::Anthropic => {
                (true, false)
            }
            ProviderKind::Bedrock => (false, false),
        };
        let choices = matches!(
            kind,
            ProviderKind::Openai | ProviderKind::OpenaiCompatible | ProviderKind::AzureOpenai
        );
        Self {
            streaming: true,
            tools: true,
            vision: true,
            json_mode,
            embeddings,
            choices,
        }
    }
}

impl ProviderKind {
    /// [`Capabilities::of`] this family.
    pub const fn capabilities(self) -> Capabilities {
        Capabilities::of(self)
    }
}
