; Inno Setup script: installs the one-folder bundle (dist\localinfer) for the current user,
; a Start-menu entry that opens the desktop app, and `localinfer` on the user's PATH.
; Built by .github/workflows/package-windows.yml: iscc /DVersion=0.1.0 /DFlavour=cpu ...
#ifndef Version
  #define Version "0.0.0"
#endif
#ifndef Flavour
  #define Flavour "cpu"
#endif

[Setup]
AppId={{6C1E4A55-5E7B-4A8A-9F1F-3D3C7A0B1C55}
AppName=localinfer
AppVersion={#Version}
AppPublisher=localinfer
DefaultDirName={localappdata}\Programs\localinfer
DefaultGroupName=localinfer
PrivilegesRequired=lowest
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
ChangesEnvironment=yes
OutputDir=..\..\dist
OutputBaseFilename=localinfer-{#Version}-windows-x64-{#Flavour}-setup
UninstallDisplayIcon={app}\localinfer.exe
Compression=lzma2
SolidCompression=yes

[Files]
Source: "..\..\dist\localinfer\*"; DestDir: "{app}"; Flags: recursesubdirs ignoreversion

[Tasks]
Name: "desktopicon"; Description: "Create a desktop shortcut"; Flags: unchecked
Name: "addtopath"; Description: "Add localinfer to PATH (for the terminal and the API server)"

[Icons]
Name: "{group}\localinfer"; Filename: "{app}\localinfer.exe"; Parameters: "app"
Name: "{autodesktop}\localinfer"; Filename: "{app}\localinfer.exe"; Parameters: "app"; Tasks: desktopicon

[Registry]
Root: HKCU; Subkey: "Environment"; ValueType: expandsz; ValueName: "Path"; \
  ValueData: "{olddata};{app}"; Tasks: addtopath; Check: NotOnPath(ExpandConstant('{app}'))

[Code]
function NotOnPath(Dir: string): Boolean;
var
  Current: string;
begin
  if not RegQueryStringValue(HKEY_CURRENT_USER, 'Environment', 'Path', Current) then
  begin
    Result := True;
    exit;
  end;
  Result := Pos(';' + Uppercase(Dir) + ';', ';' + Uppercase(Current) + ';') = 0;
end;
